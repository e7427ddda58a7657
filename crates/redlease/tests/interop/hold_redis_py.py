"""Holds a lock with redis-py's Lock (SET NX PX with a random token) until a line
arrives on stdin, then releases it. Prints "held" and "released"."""
import sys

import redis

port, key, ttl_s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
r = redis.Redis(host="127.0.0.1", port=port)
lock = r.lock(key, timeout=ttl_s)
assert lock.acquire(blocking=False), "the lock was free"
print("held", flush=True)
sys.stdin.readline()
lock.release()
print("released", flush=True)
