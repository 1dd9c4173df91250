"""Change data capture: the Debezium connectors that feed application tables into streams."""
