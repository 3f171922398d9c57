"""The Redis key layout and Lua scripts of :mod:`router.state.redis_state`.

Keys (every key carries the hash tag ``{prefix}``, so they live in one cluster slot). Every key expires:
a fleet that stops, or dies, leaves nothing behind once the longest TTL below has passed.

    {p}:replicas            SET of live replica ids (pruned by SYNC when a replica's load hash is gone);
                              renewed by every PUT and SYNC, never shortened (a replica with a shorter
                              ``lease_ttl`` must not drop a member whose load hash lives longer)
    {p}:load:<replica>      HASH, expires ``lease_ttl`` after the replica's last heartbeat:
                              _hb                 present while the replica lives
                              <worker>:v          version of the replica's numbers for that worker
                              <worker>:r / :t     the replica's in-flight requests / tokens there
                              <worker>:p          its streamed prompts' tokens there with no first
                                                  token yet (the prefill backlog; absent: 0)
    {p}:probe:<worker>      HASH: the last probe of the worker, by whichever replica probed it:
                              seq (increments per probe), ok, by, at (Redis ms), m (metrics JSON),
                              mat (the ``at`` of the probe that carried ``m``); expires ``lease_ttl``
                              after that probe (older, no replica would apply it)
    {p}:lease:<worker>      STRING, PX: the replica elected to probe the worker
    {p}:bucket:<agent>      HASH r, t, at: the agent's rate-limit buckets (TAKE_TOKENS), expire after 2 min idle
                              (by then an absent bucket reads as a full one)
    {p}:prefix              STREAM of prefix-index news (redis_state), expires a minute after its last entry

A replica's load numbers are absolute and versioned: a write only lands if its version is newer
than the stored one, so writes can arrive out of order, be repeated (every SYNC republishes all of
them) and recreate an expired hash, and the stored numbers still converge to the replica's own.
A replica killed without a goodbye leaves nothing behind once its hash expires.
"""

from __future__ import annotations

# Store one worker's numbers for this replica, renew its lease, return the OTHER replicas' totals
# for that worker: {requests, tokens, prefill tokens}.
# KEYS: load:<me>, replicas. ARGV: me, ttl_ms, load prefix, worker, version, requests, tokens, prefill
PUT = """
local k, w = KEYS[1], ARGV[4]
if tonumber(ARGV[5]) > tonumber(redis.call('HGET', k, w .. ':v') or '0') then
  redis.call('HSET', k, w .. ':v', ARGV[5], w .. ':r', ARGV[6], w .. ':t', ARGV[7], w .. ':p', ARGV[8], '_hb', '1')
end
redis.call('PEXPIRE', k, ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
local r, t, p = 0, 0, 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if id ~= ARGV[1] then
    local got = redis.call('HMGET', ARGV[3] .. id, w .. ':r', w .. ':t', w .. ':p')
    r = r + (tonumber(got[1]) or 0)
    t = t + (tonumber(got[2]) or 0)
    p = p + (tonumber(got[3]) or 0)
  end
end
return {r, t, p}
"""

# Heartbeat, republish all of this replica's numbers, and read everything in one round trip.
# Returns {{replica id, flat load hash}..., {flat probe hash per worker}..., Redis time in ms}.
# KEYS: load:<me>, replicas. ARGV: me, ttl_ms, load prefix, probe prefix, n, then n x (worker, v, r, t, p)
SYNC = """
local k, n = KEYS[1], tonumber(ARGV[5])
for i = 0, n - 1 do
  local w, v = ARGV[6 + 5 * i], ARGV[7 + 5 * i]
  if tonumber(v) > tonumber(redis.call('HGET', k, w .. ':v') or '0') then
    redis.call('HSET', k, w .. ':v', v, w .. ':r', ARGV[8 + 5 * i], w .. ':t', ARGV[9 + 5 * i],
               w .. ':p', ARGV[10 + 5 * i])
  end
end
redis.call('HSET', k, '_hb', '1')
redis.call('PEXPIRE', k, ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
local replicas = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local h = redis.call('HGETALL', ARGV[3] .. id)
  if #h == 0 then redis.call('SREM', KEYS[2], id) else table.insert(replicas, {id, h}) end
end
local probes = {}
for i = 0, n - 1 do
  table.insert(probes, redis.call('HGETALL', ARGV[4] .. ARGV[6 + 5 * i]))
end
local now = redis.call('TIME')
return {replicas, probes, tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)}
"""

# Publish a probe's outcome. KEYS: probe:<worker>. ARGV: me, ok (0|1), metrics JSON or '', ttl_ms
PUBLISH_PROBE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], 'ok', ARGV[2], 'by', ARGV[1], 'at', ms)
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'm', ARGV[3], 'mat', ms) end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return seq
"""

# Probe election: 1 when this replica holds (or just took) the worker's lease. KEYS: lease:<worker>.
# ARGV: me, ttl_ms
ELECT = """
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""

# Clean shutdown: drop this replica's reservations and probe leases at once.
# KEYS: load:<me>, replicas, then lease:<worker> for every worker. ARGV: me
GOODBYE = """
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
for i = 3, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
return 1
"""

# Rate limits: take from an agent's request and token buckets (each holds one minute's allowance,
# refilled continuously) or from neither; returns the seconds to wait, as a string (0: taken). The
# same arithmetic as router.state.buckets. KEYS: bucket:<agent>. ARGV: rpm, tpm (0: no limit),
# requests, tokens
TAKE_TOKENS = """
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + tonumber(tm[2]) / 1000
local h = redis.call('HMGET', KEYS[1], 'r', 't', 'at')
local r, t, at = tonumber(h[1]) or rpm, tonumber(h[2]) or tpm, tonumber(h[3]) or now
local el = math.max(0, now - at) / 60000
r, t = math.min(rpm, r + el * rpm), math.min(tpm, t + el * tpm)
local nr, nt = math.min(tonumber(ARGV[3]), rpm), math.min(tonumber(ARGV[4]), tpm)
local wait = 0
if rpm > 0 and nr > r then wait = math.max(wait, (nr - r) * 60 / rpm) end
if tpm > 0 and nt > t then wait = math.max(wait, (nt - t) * 60 / tpm) end
if wait == 0 then r, t = r - nr, t - nt end
redis.call('HSET', KEYS[1], 'r', string.format('%.6f', r), 't', string.format('%.6f', t),
           'at', string.format('%.3f', now))
redis.call('PEXPIRE', KEYS[1], 120000)
return string.format('%.6f', wait)
"""
