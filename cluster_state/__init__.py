"""Remote cluster state: metadata as entity blobs with a manifest written last (issue 6)."""
