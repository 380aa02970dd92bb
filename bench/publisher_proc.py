"""The paced publisher in a process of its own, so that it does not share a CPU with a consumer.

``python -m bench.publisher_proc QUEUE RATE COUNT WARMUP`` publishes ``WARMUP + COUNT``
messages stamped with their send time, at ``RATE`` per second (confirms overlapping), the
first ``WARMUP`` marked as warm-up, and prints ``sent`` when the last one is confirmed.
"""

from __future__ import annotations

import asyncio
import sys

from bench.latency import paced_publish

if __name__ == "__main__":
    queue, rate, count, warmup = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    asyncio.run(paced_publish(queue, rate, count, warmup))
    print("sent", flush=True)
