"""Reading data: where bytes live, what they are, the dataset index and the node cache.

Start here to learn how data is read. The modules at this level are what the floors above
call; the subpackages are their parts:

- ``discovery``: a dataset's glob patterns resolved to its files (local globs, remote
  listings, Hugging Face ``save_to_disk`` folders) and its dataset index registered;
- ``identity``: a shard's identity is its content checksum (what joins the recipe
  fingerprint), never its path;
- ``dataset`` cuts shards into work items, ``sources`` opens a recipe dataset's files under
  its ``on_error`` policy;
- ``storage/``: paths and URIs (``s3://``, ``gs://``, ``az://``, ``hf://``, ``http(s)://``),
  globs, range reads and retries of transient errors (``storage``), remote shards fetched and
  indexed once (``remote``), the local cache directory (``cache``), content checksums
  (``checksum``);
- ``formats/``: random access to a jsonl file's records (``shards``; their byte ranges
  ``lines``), ``parquet``, ``arrow``
  and ``tar``, and shards rewritten as multi-frame ``.zst`` (``recompress``);
- ``index/``: the dataset index written by ``zephon index`` (``index``), its columns read
  without opening shards (``table``) and the shards it stands for (``lazyshards``);
- ``nodecache/``: the process's node cache (``nodecache``): a bounded directory shared by a
  node's ranks (``cache``; its entries ``entries``, file locks ``locks``, the processes'
  plans ``plans``, eviction ``policies``, bytes held ``usage``, prefetcher ``prefetch``), fed
  with the exact future accesses (``future``), the whole decompressed shards it holds
  (``wholeshard``), the token cache's entries (``tokenstore``; a folder shared by a cluster
  behind it, ``sharedtokens``) and its counters from process
  workers (``workercounts``).
"""
