"""The engine: one trio loop per process, each socket's task tree, endpoints."""
