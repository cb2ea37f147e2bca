"""The declarative package graph: models, loading, validation and the DAG."""
