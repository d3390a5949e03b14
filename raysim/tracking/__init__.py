"""Recording a run: the MLflow run a driver writes, its store, what the store could not take yet, and
which run a resumed job continues."""
