"""Every lock kind, blocking: python every_kind.py PORT [cluster]"""
import sys, redis
from redis_native_lock import Lock, MultiLock, ReadWriteLock, ReentrantLock, Semaphore

port, cluster = int(sys.argv[1]), sys.argv[2:] == ["cluster"]
r = redis.RedisCluster(host="127.0.0.1", port=port) if cluster else redis.Redis(port=port)
with Lock(r, "{demo}:lock") as a, ReentrantLock(r, "{demo}:re") as b, \
        ReadWriteLock(r, "{demo}:rw").read() as c, Semaphore(r, "{demo}:sem", 3) as d, \
        MultiLock(r, ["{demo}:m1", "{demo}:m2"]) as e:
    print("tokens", a.token, b.token, c.token, d.token, e.tokens)
