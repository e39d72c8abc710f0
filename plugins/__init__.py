"""Built-in blob-store plugins, one module per backend, registered as entry points."""
