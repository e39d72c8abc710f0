"""A translog writer run as a subprocess by the crash tests (SIGKILLed at random points).

Usage: python translog_writer.py DIR THREADS BATCH [STORE_URL PREFIX]
Each thread appends batches of BATCH index operations with seq#s from a shared service
and prints "ACK first last" once add() returned (the operation is acknowledged).  With a
store URL the log is a RemoteTranslog: an append is acknowledged once its upload landed.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback

from shardstore.blobstores import open_store
from shardstore.translog.local import LocalTranslog
from shardstore.translog.operations import index_batch, stamp
from shardstore.translog.remote import RemoteTranslog
from shardstore.translog.tracker import LocalCheckpointTracker


def main() -> None:
    directory, threads, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    log = LocalTranslog(directory, primary_term=1, durability="request", generation_bytes=256 * 1024)
    seqs = LocalCheckpointTracker(max_seq_no=log.tracker.max_seq_no)
    writer = log
    if len(sys.argv) > 5:
        writer = RemoteTranslog(log, open_store(sys.argv[4]), sys.argv[5], buffer_interval=0.05)
    out = threading.Lock()

    def work() -> None:
        try:
            append_forever()
        except BaseException:  # a writer that cannot append must not look alive to the test
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(3)

    def append_forever() -> None:
        while True:
            first = seqs.generate_seq_nos(size)
            ids = [f"doc-{first + i}" for i in range(size)]
            writer.add(stamp(index_batch(ids, [b'{"n": %d}' % (first + i) for i in range(size)]), first, 1))
            with out:
                sys.stdout.write(f"ACK {first} {first + size - 1}\n")
                sys.stdout.flush()

    for _ in range(threads):
        threading.Thread(target=work, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
