"""Architecture table, model, backends and worker threads."""
