#!/usr/bin/env bash
# Creates the Compose secrets in ./secrets/<name> (next to docker-compose.yml): one random
# 32-character password per file. Existing files are kept, so running it again is safe; delete a
# file and run it again to rotate that password (then update the running service to match).
#
# Access is restricted by the directory (0700, owner only), not by the files. Compose bind-mounts
# each file into /run/secrets with its host owner and mode, and several services read them as
# their own non-root users (elasticsearch, kibana, kafka connect, grafana, the pipelines), so the
# files themselves must be readable by those users (0644).
set -euo pipefail

SECRET_NAMES=(
  postgres_password     # PostgreSQL superuser (postgres), used by dbsetup only
  pg_owner_password     # sv_owner: owns the schema, runs migrations
  pg_writer_password    # sv_writer: the pipelines
  pg_reader_password    # sv_reader: read-only queries
  pg_indexer_password   # sv_indexer: the search puller
  pg_cdc_password       # sv_cdc: replication login for Debezium
  elastic_password      # Elasticsearch superuser (elastic)
  kibana_password       # Elasticsearch kibana_system user, which Kibana logs in as
  connect_password      # Kafka Connect's REST API (HTTP basic authentication, user streamviews)
  grafana_password      # Grafana's admin user
)

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/secrets"

umask 077
mkdir -p "$dir"
chmod 0700 "$dir"

random_password() {
  local chars=""
  # Alphanumerics only, so a password needs no quoting in URLs, JSON or config files.
  while ((${#chars} < 32)); do
    chars+="$(head -c 1024 /dev/urandom | LC_ALL=C tr -dc 'A-Za-z0-9')"
  done
  printf '%s' "${chars:0:32}"
}

for name in "${SECRET_NAMES[@]}"; do
  file="$dir/$name"
  if [[ -s "$file" ]]; then
    echo "kept    secrets/$name"
  else
    # No trailing newline: Kafka Connect's DirectoryConfigProvider reads the file byte for byte.
    random_password >"$file"
    echo "created secrets/$name"
  fi
  chmod 0644 "$file"
done

# Kafka Connect's JAAS login module reads its users from a properties file: `user=password`.
credentials="$dir/connect_credentials"
printf 'streamviews=%s\n' "$(cat "$dir/connect_password")" >"$credentials"
chmod 0644 "$credentials"
echo "wrote   secrets/connect_credentials"
