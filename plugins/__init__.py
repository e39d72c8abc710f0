"""The built-in blob-store backends, one module per scheme, each registered as an entry point.

``memory`` (:class:`~shardstore.plugins.memory.MemoryStore`), ``file``
(:class:`~shardstore.plugins.local.LocalStore`, the embedded default), ``s3``
(:class:`~shardstore.plugins.s3.S3Store`), ``oci`` (:class:`~shardstore.plugins.oci.OCIStore`,
through OCI's S3-compatible API), ``gs`` (:class:`~shardstore.plugins.gcs.GCSStore`) and ``az``
(:class:`~shardstore.plugins.azure.AzureStore`), found through the ``shardstore.blobstores``
entry-point group (pyproject.toml).  Open them with :func:`shardstore.blobstores.open_store`;
this package imports none of them: the registry loads a backend's module (and its SDK) when
its scheme is first opened.
"""
