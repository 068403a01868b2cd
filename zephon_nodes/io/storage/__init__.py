"""Where bytes live: paths and URIs, range reads and retries, the cache directory, checksums."""
