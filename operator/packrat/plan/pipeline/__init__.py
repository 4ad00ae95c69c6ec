"""Pipelines of models (InferLine): the DAG file, its simulation, the search and the baselines."""
