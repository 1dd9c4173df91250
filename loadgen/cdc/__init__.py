"""Change data capture: rows of app.likes until counted in the views (`python -m loadgen.cdc`)."""
