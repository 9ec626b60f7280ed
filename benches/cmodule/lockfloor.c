/*
 * lockfloor: a benchmark reference, not part of the product.
 *
 * A small Redis module in C that does, through the Redis module API, the same
 * work as the Rust lock module's hot paths (LOCK.ACQUIRE, LOCK.RACQUIRE,
 * LOCK.READ, LOCK.RENEW, LOCK.RELEASE): open the key for writing, drop
 * expired holders, grant / renew / release, store the value, set the key's
 * expiry to the latest holder deadline (or delete an emptied key), replicate
 * each changed holder as a LOCK.SYNC effect in the Rust module's format, fire
 * a keyspace event and reply. Loaded next to the Rust module, it lets
 * `cargo bench --bench lockbench -- --callgrind` show what the module API
 * itself costs (the "floor") beside what the Rust module costs.
 *
 * It leaves out everything the hot paths do not touch: waiting (WAIT),
 * BIND, semaphores, multi-key grants, statistics and configuration.
 *
 * It also has the floor of the module API itself: FLOOR.SET key value ttl,
 * the least a lock must do through the module API. Its value (type
 * "flrvalue1") is one RedisModule_Alloc'd block, a uint32 length and the
 * value's bytes, nothing else; the command sets it when the key is empty,
 * gives the key its expiry and replies a counter (like a fencing token):
 * no holders, no effects, no events. Its RDB form is one string buffer,
 * loaded as the value itself. Against `SET k v NX PX ttl` it shows what the
 * module API alone costs: a module value is Redis's object + the module
 * value wrapper + the module's block (three allocations, where a string is
 * one), and in the RDB a module id, opcodes and RM_Load* calls
 * (`cargo bench --bench lockbench`, sections 1, 4 and 5).
 *
 * Loaded with the argument "floor-only", it registers only that type and
 * FLOOR.SET, so that it can be loaded beside the Rust module (whose LOCK.*
 * commands the others would clash with). With "events-only", it registers
 * only redis-lock's command names (each refusing every call) and the same
 * event subscriptions as redis-lock, each with an empty callback: the
 * module API's floor for what loading redis-lock costs every other client
 * (the bench's "What the module costs others").
 *
 * Build:
 *   cc -O2 -shared -fPIC -Wall -Wextra -Werror -I<dir of redismodule.h> \
 *      -o lockfloor.so lockfloor.c
 * (redismodule.h: the redis-module crate's src/include/).
 * Load: loadmodule lockfloor.so [floor-only | events-only]
 */

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "redismodule.h"

#define LF_ENCVER 1
#define LF_MAX_TTL 2592000000LL /* 30 days, the Rust module's default max-ttl */

enum lf_mode { LF_EXCLUSIVE = 0, LF_SHARED = 1 };

enum lf_kind { LF_ACQUIRE, LF_RACQUIRE, LF_READ };

typedef struct {
    char *owner; /* RedisModule_Alloc'd copy, binary-safe */
    size_t owner_len;
    uint32_t holds;
    uint64_t token;
    uint64_t deadline; /* unix ms */
} lf_holder;

typedef struct {
    uint32_t mode;
    uint32_t count;
    uint32_t cap;
    lf_holder holders[];
} lf_lock;

static RedisModuleType *LockType;
static RedisModuleType *FloorType;

#define FLR_ENCVER 1

/* The last number FLOOR.SET replied. */
static uint64_t floor_counter;

/* The last fencing token issued (or seen in an RDB load or an effect). */
static uint64_t last_token;

static const char *mode_name(uint32_t mode) {
    return mode == LF_SHARED ? "shared" : "exclusive";
}

static uint64_t next_token(uint64_t now) {
    uint64_t t = last_token + 1;
    uint64_t floor = now * 1000;
    if (t < floor)
        t = floor;
    last_token = t;
    return t;
}

static lf_lock *lock_new(uint32_t mode, uint32_t cap) {
    lf_lock *l = RedisModule_Alloc(sizeof(*l) + (size_t)cap * sizeof(lf_holder));
    l->mode = mode;
    l->count = 0;
    l->cap = cap;
    return l;
}

static void lock_free(void *value) {
    lf_lock *l = value;
    for (uint32_t i = 0; i < l->count; i++)
        RedisModule_Free(l->holders[i].owner);
    RedisModule_Free(l);
}

static lf_holder *lock_find(lf_lock *l, const char *owner, size_t len) {
    for (uint32_t i = 0; i < l->count; i++) {
        lf_holder *h = &l->holders[i];
        if (h->owner_len == len && memcmp(h->owner, owner, len) == 0)
            return h;
    }
    return NULL;
}

static void holder_remove(lf_lock *l, lf_holder *h) {
    RedisModule_Free(h->owner);
    lf_holder *last = &l->holders[l->count - 1];
    if (h != last)
        *h = *last;
    l->count--;
}

static uint64_t latest_deadline(const lf_lock *l) {
    uint64_t latest = 0;
    for (uint32_t i = 0; i < l->count; i++)
        if (l->holders[i].deadline > latest)
            latest = l->holders[i].deadline;
    return latest;
}

/* Decimal digits of n at dst; returns the length. */
static size_t put_u64(char *dst, uint64_t n) {
    char tmp[20];
    size_t i = sizeof(tmp);
    do {
        tmp[--i] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    memcpy(dst, tmp + i, sizeof(tmp) - i);
    return sizeof(tmp) - i;
}

/* LOCK.SYNC key <mode>:<holds>:<token>:<deadline> owner */
static void replicate_set(RedisModuleCtx *ctx, RedisModuleString *keyname,
                          const lf_lock *l, const lf_holder *h) {
    char state[80];
    const char *mode = mode_name(l->mode);
    size_t n = strlen(mode);
    memcpy(state, mode, n);
    state[n++] = ':';
    n += put_u64(state + n, h->holds);
    state[n++] = ':';
    n += put_u64(state + n, h->token);
    state[n++] = ':';
    n += put_u64(state + n, h->deadline);
    RedisModule_Replicate(ctx, "LOCK.SYNC", "sbb", keyname, state, n,
                          h->owner, h->owner_len);
}

/* LOCK.SYNC key DROP owner */
static void replicate_drop(RedisModuleCtx *ctx, RedisModuleString *keyname,
                           const char *owner, size_t len) {
    RedisModule_Replicate(ctx, "LOCK.SYNC", "scb", keyname, "DROP", owner, len);
}

/* Drops the holders whose deadline has passed, replicating each drop;
 * returns how many. */
static uint32_t purge(RedisModuleCtx *ctx, RedisModuleString *keyname,
                      lf_lock *l, uint64_t now) {
    uint32_t dropped = 0;
    uint32_t i = 0;
    while (i < l->count) {
        lf_holder *h = &l->holders[i];
        if (h->deadline > now) {
            i++;
            continue;
        }
        replicate_drop(ctx, keyname, h->owner, h->owner_len);
        holder_remove(l, h);
        dropped++;
    }
    return dropped;
}

/* Writes a changed lock back: deletes the key when it emptied, else the key
 * expires with its last holder. */
static void write_back(RedisModuleKey *key, lf_lock *l) {
    if (l->count == 0)
        RedisModule_DeleteKey(key);
    else
        RedisModule_SetAbsExpire(key, (mstime_t)latest_deadline(l));
}

/* Opens the key for writing; *lock is its value, or NULL when the key does
 * not exist. Returns NULL (after replying WRONGTYPE) for a key of another type. */
static RedisModuleKey *open_lock(RedisModuleCtx *ctx, RedisModuleString *keyname,
                                 lf_lock **lock) {
    RedisModuleKey *key = RedisModule_OpenKey(ctx, keyname, REDISMODULE_READ | REDISMODULE_WRITE);
    int type = RedisModule_KeyType(key);
    if (type == REDISMODULE_KEYTYPE_EMPTY) {
        *lock = NULL;
        return key;
    }
    if (type != REDISMODULE_KEYTYPE_MODULE || RedisModule_ModuleTypeGetType(key) != LockType) {
        RedisModule_CloseKey(key);
        RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
        return NULL;
    }
    *lock = RedisModule_ModuleTypeGetValue(key);
    return key;
}

/* owner (non-empty) and ttl (1..LF_MAX_TTL) arguments; replies the error
 * and returns 0 when one is invalid. */
static int parse_owner(RedisModuleCtx *ctx, RedisModuleString *arg,
                       const char **owner, size_t *len) {
    *owner = RedisModule_StringPtrLen(arg, len);
    if (*len == 0) {
        RedisModule_ReplyWithError(ctx, "ERR owner must not be empty");
        return 0;
    }
    return 1;
}

static int parse_ttl(RedisModuleCtx *ctx, RedisModuleString *arg, uint64_t *ttl) {
    long long v;
    if (RedisModule_StringToLongLong(arg, &v) != REDISMODULE_OK || v < 1 || v > LF_MAX_TTL) {
        RedisModule_ReplyWithError(ctx, "ERR ttl must be an integer from 1 to 2592000000");
        return 0;
    }
    *ttl = (uint64_t)v;
    return 1;
}

static void notify(RedisModuleCtx *ctx, const char *event, RedisModuleString *keyname) {
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_MODULE, event, keyname);
}

/* LOCK.ACQUIRE | LOCK.RACQUIRE | LOCK.READ key owner ttl */
static int grant(RedisModuleCtx *ctx, RedisModuleString **argv, int argc,
                 enum lf_kind kind, const char *event) {
    if (argc != 4)
        return RedisModule_ReplyWithError(ctx, "ERR wrong number of arguments");
    const char *owner;
    size_t owner_len;
    uint64_t ttl;
    if (!parse_owner(ctx, argv[2], &owner, &owner_len) || !parse_ttl(ctx, argv[3], &ttl))
        return REDISMODULE_OK;

    RedisModuleString *keyname = argv[1];
    lf_lock *l;
    RedisModuleKey *key = open_lock(ctx, keyname, &l);
    if (!key)
        return REDISMODULE_OK;

    uint32_t want = kind == LF_READ ? LF_SHARED : LF_EXCLUSIVE;
    uint64_t now = (uint64_t)RedisModule_Milliseconds();
    uint64_t deadline = now + ttl;
    uint32_t expired = l ? purge(ctx, keyname, l, now) : 0;
    lf_holder *h = NULL;
    int refused = 0;
    const char *error = NULL;

    if (l && l->count > 0) {
        lf_holder *mine = lock_find(l, owner, owner_len);
        if (mine) {
            if (l->mode != want)
                error = l->mode == LF_SHARED
                            ? "ERR owner holds this lock shared: release it before acquiring it exclusively"
                            : "ERR owner holds this lock exclusively: release it before reading it";
            else if (kind != LF_ACQUIRE && mine->holds == UINT32_MAX)
                error = "ERR owner has too many holds on this lock";
            else {
                if (kind != LF_ACQUIRE)
                    mine->holds++;
                mine->deadline = deadline;
                h = mine;
            }
        } else if (l->mode == LF_SHARED && want == LF_SHARED) {
            if (l->count == l->cap) {
                /* Grow: a new block, and the key pointed at it. */
                lf_lock *bigger = lock_new(l->mode, l->cap * 2);
                bigger->count = l->count;
                memcpy(bigger->holders, l->holders, (size_t)l->count * sizeof(lf_holder));
                RedisModule_ModuleTypeReplaceValue(key, LockType, bigger, NULL);
                RedisModule_Free(l);
                l = bigger;
            }
        } else {
            refused = 1;
        }
    } else if (l) {
        l->mode = want; /* emptied by the purge: the new grant sets the mode */
    } else {
        l = lock_new(want, want == LF_SHARED ? 4 : 1);
        RedisModule_ModuleTypeSetValue(key, LockType, l);
    }

    if (!h && !refused && !error) {
        h = &l->holders[l->count++];
        h->owner = RedisModule_Alloc(owner_len);
        memcpy(h->owner, owner, owner_len);
        h->owner_len = owner_len;
        h->holds = 1;
        h->token = next_token(now);
        h->deadline = deadline;
    }

    if (h) {
        replicate_set(ctx, keyname, l, h);
        write_back(key, l);
    } else if (expired) {
        write_back(key, l);
    }
    RedisModule_CloseKey(key);

    if (expired)
        notify(ctx, "lock.expired", keyname);
    if (h) {
        notify(ctx, event, keyname);
        return RedisModule_ReplyWithLongLong(ctx, (long long)h->token);
    }
    if (error)
        return RedisModule_ReplyWithError(ctx, error);
    return RedisModule_ReplyWithNull(ctx);
}

static int acquire_cmd(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return grant(ctx, argv, argc, LF_ACQUIRE, "lock.acquire");
}

static int racquire_cmd(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return grant(ctx, argv, argc, LF_RACQUIRE, "lock.racquire");
}

static int read_cmd(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return grant(ctx, argv, argc, LF_READ, "lock.read");
}

/* LOCK.RENEW key owner ttl: 1 when the owner holds (deadline = now + ttl), else 0. */
static int renew_cmd(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 4)
        return RedisModule_ReplyWithError(ctx, "ERR wrong number of arguments");
    const char *owner;
    size_t owner_len;
    uint64_t ttl;
    if (!parse_owner(ctx, argv[2], &owner, &owner_len) || !parse_ttl(ctx, argv[3], &ttl))
        return REDISMODULE_OK;

    RedisModuleString *keyname = argv[1];
    lf_lock *l;
    RedisModuleKey *key = open_lock(ctx, keyname, &l);
    if (!key)
        return REDISMODULE_OK;
    if (!l) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithLongLong(ctx, 0);
    }

    uint64_t now = (uint64_t)RedisModule_Milliseconds();
    uint32_t expired = purge(ctx, keyname, l, now);
    lf_holder *h = lock_find(l, owner, owner_len);
    if (h) {
        h->deadline = now + ttl;
        replicate_set(ctx, keyname, l, h);
    }
    if (h || expired)
        write_back(key, l);
    RedisModule_CloseKey(key);

    if (expired)
        notify(ctx, "lock.expired", keyname);
    if (h)
        notify(ctx, "lock.renew", keyname);
    return RedisModule_ReplyWithLongLong(ctx, h ? 1 : 0);
}

/* LOCK.RELEASE key owner: 1 when the owner's last hold goes, 0 when a hold
 * remains, nil when the owner held nothing. */
static int release_cmd(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3)
        return RedisModule_ReplyWithError(ctx, "ERR wrong number of arguments");
    const char *owner;
    size_t owner_len;
    if (!parse_owner(ctx, argv[2], &owner, &owner_len))
        return REDISMODULE_OK;

    RedisModuleString *keyname = argv[1];
    lf_lock *l;
    RedisModuleKey *key = open_lock(ctx, keyname, &l);
    if (!key)
        return REDISMODULE_OK;
    if (!l) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithNull(ctx);
    }

    uint64_t now = (uint64_t)RedisModule_Milliseconds();
    uint32_t expired = purge(ctx, keyname, l, now);
    lf_holder *h = lock_find(l, owner, owner_len);
    int result = -1; /* nil */
    if (h && h->holds > 1) {
        h->holds--;
        replicate_set(ctx, keyname, l, h);
        result = 0;
    } else if (h) {
        replicate_drop(ctx, keyname, owner, owner_len);
        holder_remove(l, h);
        result = 1;
    }
    if (h || expired)
        write_back(key, l);
    RedisModule_CloseKey(key);

    if (expired)
        notify(ctx, "lock.expired", keyname);
    if (result < 0)
        return RedisModule_ReplyWithNull(ctx);
    notify(ctx, "lock.release", keyname);
    return RedisModule_ReplyWithLongLong(ctx, result);
}

/* Digits only, at most 20, no overflow. */
static int parse_u64(const char *s, size_t len, uint64_t *out) {
    if (len == 0 || len > 20)
        return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

/* <mode>:<holds>:<token>:<deadline> */
static int parse_state(const char *s, size_t len, uint32_t *mode, uint64_t num[3]) {
    const char *end = s + len;
    const char *colon = memchr(s, ':', len);
    if (!colon)
        return 0;
    size_t n = (size_t)(colon - s);
    if (n == 9 && memcmp(s, "exclusive", 9) == 0)
        *mode = LF_EXCLUSIVE;
    else if (n == 6 && memcmp(s, "shared", 6) == 0)
        *mode = LF_SHARED;
    else
        return 0;
    s = colon + 1;
    for (int i = 0; i < 3; i++) {
        const char *stop = i < 2 ? memchr(s, ':', (size_t)(end - s)) : end;
        if (!stop || !parse_u64(s, (size_t)(stop - s), &num[i]))
            return 0;
        s = stop + 1;
    }
    return num[0] >= 1 && num[0] <= UINT32_MAX;
}

/* LOCK.SYNC key state|DROP owner: internal, from the master or the AOF only. */
static int sync_cmd(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    int flags = RedisModule_GetContextFlags(ctx);
    if (!(flags & (REDISMODULE_CTX_FLAGS_REPLICATED | REDISMODULE_CTX_FLAGS_LOADING)))
        return RedisModule_ReplyWithError(
            ctx, "ERR LOCK.SYNC is internal: accepted only from the master or the AOF");
    if (argc != 4)
        return RedisModule_ReplyWithError(ctx, "ERR wrong number of arguments");

    size_t op_len, owner_len;
    const char *op = RedisModule_StringPtrLen(argv[2], &op_len);
    const char *owner = RedisModule_StringPtrLen(argv[3], &owner_len);
    int drop = op_len == 4 && strncasecmp(op, "DROP", 4) == 0;
    uint32_t mode = LF_EXCLUSIVE;
    uint64_t num[3] = {0, 0, 0};
    if (!drop && !parse_state(op, op_len, &mode, num))
        return RedisModule_ReplyWithError(ctx, "ERR invalid lock state");

    lf_lock *l;
    RedisModuleKey *key = open_lock(ctx, argv[1], &l);
    if (!key)
        return REDISMODULE_OK;

    if (drop) {
        lf_holder *h = l ? lock_find(l, owner, owner_len) : NULL;
        if (h) {
            holder_remove(l, h);
            write_back(key, l);
        }
    } else {
        if (!l) {
            l = lock_new(mode, mode == LF_SHARED ? 4 : 1);
            RedisModule_ModuleTypeSetValue(key, LockType, l);
        }
        lf_holder *h = lock_find(l, owner, owner_len);
        if (!h) {
            if (l->count == l->cap) {
                lf_lock *bigger = lock_new(l->mode, l->cap * 2);
                bigger->count = l->count;
                memcpy(bigger->holders, l->holders, (size_t)l->count * sizeof(lf_holder));
                RedisModule_ModuleTypeReplaceValue(key, LockType, bigger, NULL);
                RedisModule_Free(l);
                l = bigger;
            }
            h = &l->holders[l->count++];
            h->owner = RedisModule_Alloc(owner_len);
            memcpy(h->owner, owner, owner_len);
            h->owner_len = owner_len;
        }
        l->mode = mode;
        h->holds = (uint32_t)num[0];
        h->token = num[1];
        h->deadline = num[2];
        if (h->token > last_token)
            last_token = h->token;
        write_back(key, l);
    }
    RedisModule_CloseKey(key);
    RedisModule_ReplicateVerbatim(ctx); /* on to this replica's replicas and AOF */
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

/* ---- the module API's floor ---- */

/* FLOOR.SET key value ttl: when the key is empty, a value of one block (a
 * uint32 length, then the bytes) that expires in ttl ms, and a counter's
 * next number; nil when the key exists. Nothing else. */
static int floor_set_cmd(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 4)
        return RedisModule_ReplyWithError(ctx, "ERR wrong number of arguments");
    uint64_t ttl;
    if (!parse_ttl(ctx, argv[3], &ttl))
        return REDISMODULE_OK;
    size_t len;
    const char *value = RedisModule_StringPtrLen(argv[2], &len);
    if (len > UINT32_MAX)
        return RedisModule_ReplyWithError(ctx, "ERR value too long");

    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    if (RedisModule_KeyType(key) != REDISMODULE_KEYTYPE_EMPTY) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithNull(ctx);
    }
    uint32_t n = (uint32_t)len;
    char *block = RedisModule_Alloc(sizeof(n) + len);
    memcpy(block, &n, sizeof(n));
    memcpy(block + sizeof(n), value, len);
    RedisModule_ModuleTypeSetValue(key, FloorType, block);
    RedisModule_SetAbsExpire(key, RedisModule_Milliseconds() + (mstime_t)ttl);
    RedisModule_CloseKey(key);
    return RedisModule_ReplyWithLongLong(ctx, (long long)++floor_counter);
}

static void *floor_rdb_load(RedisModuleIO *rdb, int encver) {
    if (encver != FLR_ENCVER)
        return NULL;
    size_t len;
    char *block = RedisModule_LoadStringBuffer(rdb, &len);
    if (!block)
        return NULL;
    uint32_t n = 0;
    if (len >= sizeof(n))
        memcpy(&n, block, sizeof(n));
    if (len < sizeof(n) || n != len - sizeof(n)) {
        RedisModule_Free(block);
        return NULL;
    }
    return block;
}

static void floor_rdb_save(RedisModuleIO *rdb, void *value) {
    uint32_t n;
    memcpy(&n, value, sizeof(n));
    RedisModule_SaveStringBuffer(rdb, value, sizeof(n) + n);
}

static size_t floor_mem_usage(const void *value) {
    uint32_t n;
    memcpy(&n, value, sizeof(n));
    return sizeof(n) + n;
}

static void floor_free(void *value) {
    RedisModule_Free(value);
}

/* ---- data type callbacks ---- */

static void *lock_rdb_load(RedisModuleIO *rdb, int encver) {
    if (encver != LF_ENCVER)
        return NULL;
    uint32_t mode = (uint32_t)RedisModule_LoadUnsigned(rdb);
    (void)RedisModule_LoadUnsigned(rdb); /* limit: 0, no semaphores here */
    uint64_t count = RedisModule_LoadUnsigned(rdb);
    if (mode > LF_SHARED || count > UINT32_MAX)
        return NULL;
    lf_lock *l = lock_new(mode, count ? (uint32_t)count : 1);
    for (uint64_t i = 0; i < count; i++) {
        lf_holder *h = &l->holders[i];
        h->owner = RedisModule_LoadStringBuffer(rdb, &h->owner_len);
        h->holds = (uint32_t)RedisModule_LoadUnsigned(rdb);
        h->token = RedisModule_LoadUnsigned(rdb);
        h->deadline = RedisModule_LoadUnsigned(rdb);
        l->count++;
        if (h->token > last_token)
            last_token = h->token;
    }
    return l;
}

static void lock_rdb_save(RedisModuleIO *rdb, void *value) {
    const lf_lock *l = value;
    RedisModule_SaveUnsigned(rdb, l->mode);
    RedisModule_SaveUnsigned(rdb, 0);
    RedisModule_SaveUnsigned(rdb, l->count);
    for (uint32_t i = 0; i < l->count; i++) {
        const lf_holder *h = &l->holders[i];
        RedisModule_SaveStringBuffer(rdb, h->owner, h->owner_len);
        RedisModule_SaveUnsigned(rdb, h->holds);
        RedisModule_SaveUnsigned(rdb, h->token);
        RedisModule_SaveUnsigned(rdb, h->deadline);
    }
}

static size_t lock_mem_usage(const void *value) {
    const lf_lock *l = value;
    size_t size = sizeof(*l) + (size_t)l->cap * sizeof(lf_holder);
    for (uint32_t i = 0; i < l->count; i++)
        size += l->holders[i].owner_len;
    return size;
}

/* ---- events-only: the API's floor for what redis-lock hears ----
 *
 * The same subscriptions redis-lock makes at rest (src/durability/events.rs:
 * the generic keyspace class, and the server events FLUSHDB, SWAPDB,
 * REPLICATION_ROLE_CHANGED, LOADING and FORK_CHILD), each with an empty
 * callback: what Redis itself spends on a module that hears them, which no
 * module can go below. The bench's tax table (section "What the module
 * costs others") puts it beside the module. */

static int empty_keyspace(RedisModuleCtx *ctx, int type, const char *event,
                          RedisModuleString *key) {
    (void)ctx;
    (void)type;
    (void)event;
    (void)key;
    return REDISMODULE_OK;
}

static void empty_server_event(RedisModuleCtx *ctx, RedisModuleEvent e, uint64_t sub,
                               void *data) {
    (void)ctx;
    (void)e;
    (void)sub;
    (void)data;
}

static int subscribe_empty(RedisModuleCtx *ctx) {
    if (RedisModule_SubscribeToKeyspaceEvents(ctx, REDISMODULE_NOTIFY_GENERIC,
                                              empty_keyspace) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    RedisModuleEvent events[] = {
        RedisModuleEvent_FlushDB,
        RedisModuleEvent_SwapDB,
        RedisModuleEvent_ReplicationRoleChanged,
        RedisModuleEvent_Loading,
        RedisModuleEvent_ForkChild,
    };
    for (size_t i = 0; i < sizeof(events) / sizeof(events[0]); i++)
        if (RedisModule_SubscribeToServerEvent(ctx, events[i], empty_server_event) ==
            REDISMODULE_ERR)
            return REDISMODULE_ERR;
    return REDISMODULE_OK;
}

/* The command names redis-lock registers, in its order (src/lib.rs's
 * COMMANDS), so that the server's command table holds the same names laid
 * out the same way: a lookup of another command walks what it walks beside
 * redis-lock. Each refuses every call, but for two that give the floor the
 * shape of a server where locks are in use (the bench's busy shape), so
 * that what Redis itself does for it counts on both sides:
 *
 * - LOCK.ACQUIRE key owner ttl WAIT ms blocks its caller as redis-lock
 *   blocks a waiter (src/state/waiting.rs): RedisModule_BlockClient with a
 *   reply callback, a free callback, a disconnect callback and no timeout
 *   of Redis's (redis-lock keeps its waiters' deadlines itself). Nothing
 *   unblocks it but its connection's close.
 * - LOCK.KEEPALIVE ttl (below) hears what redis-lock hears while a grant
 *   is bound.
 * - LOCK.READ key owner ttl arms a module timer ttl ms away, as redis-lock
 *   plans a visit of a shared lock whose readers' leases run out apart
 *   (src/state/timers.rs: one module timer at the earliest visit). It
 *   replies 1 and never fires in a bench's life. */
static int stub_cmd(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    return RedisModule_ReplyWithError(ctx, "ERR events-only");
}

static int waiter_reply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    return RedisModule_ReplyWithNull(ctx);
}

static void waiter_free(RedisModuleCtx *ctx, void *privdata) {
    (void)ctx;
    (void)privdata;
}

static void waiter_gone(RedisModuleCtx *ctx, RedisModuleBlockedClient *bc) {
    (void)ctx;
    RedisModule_UnblockClient(bc, NULL);
}

static int arg_is(RedisModuleString *arg, const char *word) {
    size_t len;
    const char *s = RedisModule_StringPtrLen(arg, &len);
    return len == strlen(word) && strncasecmp(s, word, len) == 0;
}

static int stub_acquire(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 6 || !arg_is(argv[4], "wait"))
        return stub_cmd(ctx, argv, argc);
    RedisModuleBlockedClient *bc =
        RedisModule_BlockClient(ctx, waiter_reply, NULL, waiter_free, 0);
    if (!bc)
        return RedisModule_ReplyWithError(ctx, "ERR could not block");
    RedisModule_SetDisconnectCallback(bc, waiter_gone);
    return REDISMODULE_OK;
}

static void visit_due(RedisModuleCtx *ctx, void *data) {
    (void)ctx;
    (void)data;
}

static int stub_read(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    long long ttl;
    if (argc != 4 || RedisModule_StringToLongLong(argv[3], &ttl) == REDISMODULE_ERR || ttl <= 0)
        return stub_cmd(ctx, argv, argc);
    RedisModule_CreateTimer(ctx, ttl, visit_due, NULL);
    return RedisModule_ReplyWithLongLong(ctx, 1);
}

/* LOCK.KEEPALIVE ttl gives the floor what redis-lock hears while a holder
 * is bound to a connection (src/durability/events.rs, watch_clients):
 * closed connections (CLIENT_CHANGE), with an empty callback. (No command
 * filter: redis-lock reads a script's caller from the server's current
 * client, src/redis/script_caller.rs.) Once; it replies 1. */
static int bound_once = 0;

static int stub_keepalive(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 2)
        return stub_cmd(ctx, argv, argc);
    if (!bound_once) {
        bound_once = 1;
        RedisModule_SubscribeToServerEvent(ctx, RedisModuleEvent_ClientChange,
                                           empty_server_event);
    }
    return RedisModule_ReplyWithLongLong(ctx, 1);
}

static int register_names(RedisModuleCtx *ctx) {
    static const char *names[] = {
        "lock.acquire", "lock.racquire", "lock.read",      "lock.semaphore",
        "lock.macquire", "lock.release", "lock.renew",     "lock.info",
        "lock.keepalive", "lock.guard",  "lock.session",   "lock.sync",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        RedisModuleCmdFunc fn = stub_cmd;
        if (strcmp(names[i], "lock.acquire") == 0)
            fn = stub_acquire;
        else if (strcmp(names[i], "lock.read") == 0)
            fn = stub_read;
        else if (strcmp(names[i], "lock.keepalive") == 0)
            fn = stub_keepalive;
        if (RedisModule_CreateCommand(ctx, names[i], fn, "write", 0, 0, 0) == REDISMODULE_ERR)
            return REDISMODULE_ERR;
    }
    return REDISMODULE_OK;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (RedisModule_Init(ctx, "lockfloor", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    if (argc == 1) {
        size_t len;
        const char *arg = RedisModule_StringPtrLen(argv[0], &len);
        if (len == 11 && strncasecmp(arg, "events-only", 11) == 0) {
            if (register_names(ctx) == REDISMODULE_ERR)
                return REDISMODULE_ERR;
            return subscribe_empty(ctx);
        }
    }

    RedisModuleTypeMethods fm = {
        .version = REDISMODULE_TYPE_METHOD_VERSION,
        .rdb_load = floor_rdb_load,
        .rdb_save = floor_rdb_save,
        .mem_usage = floor_mem_usage,
        .free = floor_free,
    };
    FloorType = RedisModule_CreateDataType(ctx, "flrvalue1", FLR_ENCVER, &fm);
    if (!FloorType)
        return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "floor.set", floor_set_cmd, "write deny-oom", 1, 1, 1) ==
        REDISMODULE_ERR)
        return REDISMODULE_ERR;
    if (argc == 1) {
        size_t len;
        const char *arg = RedisModule_StringPtrLen(argv[0], &len);
        if (len == 10 && strncasecmp(arg, "floor-only", 10) == 0)
            return REDISMODULE_OK;
    }
    if (argc != 0) {
        RedisModule_Log(ctx, "warning",
                        "lockfloor: the only argument is floor-only or events-only");
        return REDISMODULE_ERR;
    }

    RedisModuleTypeMethods tm = {
        .version = REDISMODULE_TYPE_METHOD_VERSION,
        .rdb_load = lock_rdb_load,
        .rdb_save = lock_rdb_save,
        .mem_usage = lock_mem_usage,
        .free = lock_free,
    };
    LockType = RedisModule_CreateDataType(ctx, "lockflr01", LF_ENCVER, &tm);
    if (!LockType)
        return REDISMODULE_ERR;

    static const struct {
        const char *name;
        RedisModuleCmdFunc fn;
        const char *flags;
    } cmds[] = {
        {"lock.acquire", acquire_cmd, "write deny-oom"},
        {"lock.racquire", racquire_cmd, "write deny-oom"},
        {"lock.read", read_cmd, "write deny-oom"},
        {"lock.renew", renew_cmd, "write fast"},
        {"lock.release", release_cmd, "write fast"},
        {"lock.sync", sync_cmd, "write"},
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (RedisModule_CreateCommand(ctx, cmds[i].name, cmds[i].fn, cmds[i].flags, 1, 1, 1) ==
            REDISMODULE_ERR)
            return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
