"""The local stack: Kafka, Kafka Connect with Debezium, PostgreSQL and Elasticsearch without Docker."""
