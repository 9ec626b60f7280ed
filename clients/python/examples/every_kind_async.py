"""Every lock kind, asyncio: python every_kind_async.py PORT [cluster]"""
import asyncio, sys, redis.asyncio as redis
from redis_native_lock.aio import Lock, MultiLock, ReadWriteLock, ReentrantLock, Semaphore

async def main(port, cluster):
    r = redis.RedisCluster(host="127.0.0.1", port=port) if cluster else redis.Redis(port=port)
    async with Lock(r, "{demo}:lock") as a, ReentrantLock(r, "{demo}:re") as b, \
            ReadWriteLock(r, "{demo}:rw").write() as c, Semaphore(r, "{demo}:sem", 3) as d, \
            MultiLock(r, ["{demo}:m1", "{demo}:m2"]) as e:
        print("tokens", a.token, b.token, c.token, d.token, e.tokens)
    await r.aclose()

asyncio.run(main(int(sys.argv[1]), sys.argv[2:] == ["cluster"]))
