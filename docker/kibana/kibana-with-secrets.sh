#!/bin/sh
# Kibana reads no *_FILE variables, so take the kibana_system password from the Compose secret
# and hand over to the image's own start script. The password never appears in the compose file.
set -eu
ELASTICSEARCH_PASSWORD="$(cat "${KIBANA_PASSWORD_FILE:-/run/secrets/kibana_password}")"
export ELASTICSEARCH_PASSWORD
exec /usr/local/bin/kibana-docker "$@"
