"""The audit log: the writer, the ctid-block puller into Elasticsearch, retention, search, Kibana."""
