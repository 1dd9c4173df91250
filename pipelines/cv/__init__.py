"""The continuous-view engine: streams and views declared in SQL, maintained in batches."""
