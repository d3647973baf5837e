"""The S3 blob store's rates on an S3 endpoint: put, get and delete of 10 KiB blobs from one thread and from
several, and DeleteObjects batches of 1000 keys; beside them, the bare boto3 calls the store makes
(put_object, get_object, delete_object), issued with the same client settings and no mailq code, as the
floor on this machine. `delete` is HEAD + DELETE (the store says whether the blob existed).

    eval "$(.venv/bin/python -m mailq_servers env s3)"      # after `python -m mailq_servers up s3`
    .venv/bin/python benchmarks/blob_store_rates.py [--blobs 2000] [--size 10240] [--threads 8] [--batches 5]

The endpoint is $MAILQ_S3_ENDPOINT (None: AWS), the credentials the AWS chain's. A fresh bucket is created
and removed at the end. The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from quick import parse_args

from mailq_runtime.blobs.s3_store import S3BlobStore
from mailq_runtime.model import BlobId


def rate(operation: Callable[[BlobId], object], ids: Sequence[BlobId], threads: int) -> float:
    started = time.perf_counter()
    if threads == 1:
        for blob_id in ids:
            operation(blob_id)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(operation, ids))
    return len(ids) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blobs", type=int, default=2000, help="blobs per measure (default 2000)")
    parser.add_argument("--size", type=int, default=10 * 1024, help="bytes a blob (default 10240)")
    parser.add_argument("--threads", type=int, default=8, help="threads of the parallel measures (default 8)")
    parser.add_argument("--batches", type=int, default=5, help="DeleteObjects of 1000 keys timed (default 5)")
    args = parse_args(parser, {"blobs": 50, "threads": 4, "batches": 1})

    endpoint = os.environ.get("MAILQ_S3_ENDPOINT") or None
    region = os.environ.get("AWS_DEFAULT_REGION") or None
    bucket = f"mailq-bench-{int(time.time())}-{secrets.token_hex(3)}"
    store = S3BlobStore(bucket, endpoint_url=endpoint, region=region)
    client = store._client  # the bare floor: the same client, settings and connection pool
    client.create_bucket(Bucket=bucket)
    payload = os.urandom(args.size)
    counter = iter(range(10**9))

    def fresh(count: int) -> list[BlobId]:
        return [BlobId(1, hashlib.sha256(b"%d" % next(counter)).hexdigest()) for _ in range(count)]

    figures: dict[str, float | list[float]] = {}
    try:
        for threads in (1, args.threads):
            ids, bare_ids = fresh(args.blobs), fresh(args.blobs)
            suffix = f"{threads}_thread{'s' if threads > 1 else ''}"
            figures[f"put_{suffix}"] = rate(lambda b: store.put(b, payload), ids, threads)
            figures[f"bare_put_{suffix}"] = rate(
                lambda b: client.put_object(
                    Bucket=bucket, Key=str(b), Body=payload, ChecksumAlgorithm="CRC32"
                ),
                bare_ids,
                threads,
            )
            figures[f"get_{suffix}"] = rate(store.get, ids, threads)
            figures[f"bare_get_{suffix}"] = rate(
                lambda b: client.get_object(Bucket=bucket, Key=str(b), ChecksumMode="ENABLED")["Body"].read(),
                bare_ids,
                threads,
            )
            figures[f"delete_{suffix}"] = rate(store.delete, ids, threads)
            figures[f"bare_delete_{suffix}"] = rate(
                lambda b: client.delete_object(Bucket=bucket, Key=str(b)), bare_ids, threads
            )
        batch_seconds = []
        for _ in range(args.batches):
            ids = fresh(1000)
            rate(lambda b: store.put(b, payload), ids, args.threads)
            started = time.perf_counter()
            assert store.delete_many(ids) == 1000
            batch_seconds.append(time.perf_counter() - started)
            assert not any(True for _ in store.list_ids())
        figures["delete_many_1000_seconds"] = batch_seconds
        figures["delete_many_1000_median_seconds"] = statistics.median(batch_seconds)
    finally:
        store.delete_many(list(store.list_ids()))
        client.delete_bucket(Bucket=bucket)
        store.close()

    print(f"S3 at {endpoint or 'AWS'}: {args.blobs} blobs of {args.size} bytes a measure")
    print(f"{'operation':<10} {'threads':>7} {'store/s':>9} {'bare/s':>9} {'ratio':>6}")
    for operation in ("put", "get", "delete"):
        for threads in (1, args.threads):
            suffix = f"{threads}_thread{'s' if threads > 1 else ''}"
            mine, bare = figures[f"{operation}_{suffix}"], figures[f"bare_{operation}_{suffix}"]
            print(f"{operation:<10} {threads:>7} {mine:>9.0f} {bare:>9.0f} {mine / bare:>6.2f}")
    print(
        "delete_many of 1000 keys: "
        + ", ".join(f"{seconds:.3f}" for seconds in batch_seconds)
        + f" s (median {figures['delete_many_1000_median_seconds']:.3f} s)"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
