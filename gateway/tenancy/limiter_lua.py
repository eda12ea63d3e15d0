"""The Lua scripts of admission: (authenticate and) admit, heartbeat, settle. One atomic round trip each.

Time is Redis's own (`TIME`), so any number of gateways on any hosts agree on
windows, leases and calendar days. Keys are derived inside the scripts from
the prefix and names (the budget keys depend on Redis's clock): standalone
Redis only, not Redis Cluster.

Layout (P = prefix; S = "tenant:{name}", "key:{key_id}", or "model:{name}:{model id}" for one
tenant on one model, issue 42: a tenant name never holds ':', so the model id may):

    P:quota:S                      hash  limit overrides (quota_store.py)
    P:rl:S                         hash  token buckets: req, in, out (level) + req_t, in_t, out_t (ms)
    P:conc:S                       zset  reservation id -> lease expiry (ms)
    P:budget:S:d:YYYYMMDD          int   tokens charged that UTC day (reserved, then settled)
    P:budget:S:m:YYYYMM            int   tokens charged that UTC month
    P:resv:{id}                    hash  tenant, kid, model, weight, prompt, output, day, month, settled
    P:usage:S:YYYYMMDD             hash  requests, prompt_tokens, cached_tokens, completion_tokens, errors
    P:usage:models:{name}          set   the model ids the tenant has usage on

Per-minute limits are token buckets of capacity L refilling at L/60 per second:
a burst admits exactly L, then the rate is L per minute. A missing bucket
hash is a full bucket, so each hash expires 61 s after its last debit.

The per-model scope is a third scope beside the tenant and the key, checked
and charged in the same call: its limits are only its overrides (no tier
defaults), and a request names its model ('' for none: no third scope).
A model's cost weight W (the gateway's --model-cost-weight, default 1) makes
its tokens count ceil(tokens x W) against the tenant's and the key's token
limits and budgets, so one budget is fair across a small and a large model;
the model's own scope, rpm, concurrency and usage count plain tokens.
"""

from __future__ import annotations

# Shared by admit and heartbeat: `now` in ms, UTC day and month, ms to their ends.
_CLOCK = """
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now = sec * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_CALENDAR = """
local function civil(z)  -- days since 1970-01-01 -> y, m, d (H. Hinnant)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  return yoe + era * 400 + (m <= 2 and 1 or 0), m, doy - math.floor((153 * mp + 2) / 5) + 1
end
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = m > 2 and m - 3 or m + 9
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + math.floor((153 * mp + 2) / 5) + d - 1
  return era * 146097 + doe - 719468
end
local days = math.floor(sec / 86400)
local y, m, d = civil(days)
local day, month = string.format('%04d%02d%02d', y, m, d), string.format('%04d%02d', y, m)
local day_reset = (days + 1) * 86400000 - now
local month_reset = days_from_civil(m == 12 and y + 1 or y, m == 12 and 1 or m + 1, 1) * 86400000 - now
"""

# The quota check and reservation, shared by ADMIT and AUTH_ADMIT. Their prologues set the locals
# P, tenant, kid, model, weight, rid, prompt, output, lease_ms, resv_ttl, defaults (the tier's six limits) and
# reply(out), which may append to what the body returns:
#   {1, hdr x6, leased (0|1)} admitted, or {0, field, scope, limit, need, available, retry_ms, fits, hdr x6}.
# hdr = requests limit, remaining, reset ms, tokens limit, remaining, reset ms (-1 = no such limit).
_ADMIT_BODY = """
local FIELDS = {'rpm', 'input_tpm', 'output_tpm', 'concurrency', 'daily_tokens', 'monthly_tokens'}

local function limits(hkey, with_defaults)
  local lim = {}
  for i, f in ipairs(FIELDS) do lim[f] = with_defaults and defaults[i] or -1 end
  local raw = redis.call('HGETALL', hkey)
  for i = 1, #raw, 2 do lim[raw[i]] = tonumber(raw[i + 1]) end
  return lim
end
local scopes = {{name = 'tenant', id = tenant}}
if kid ~= '' then scopes[#scopes + 1] = {name = 'key', id = kid} end
if model ~= '' then
  scopes[#scopes + 1] = {name = 'model', id = tenant .. ':' .. model, label = 'tenant ' .. tenant .. ' on model ' .. model}
end
local function weighted(n, w)  -- exact at weight 1; 1e-6: 0.1 x 30 is 3, not 4
  if w == 1 or n == 0 then return n end  -- (ceil(-1e-6) would be "-0", not an integer to Redis)
  return math.ceil(n * w - 1e-6)
end
for i, s in ipairs(scopes) do
  s.base = s.name .. ':' .. s.id
  s.lim = limits(P .. ':quota:' .. s.base, i == 1)
  local w = s.name == 'model' and 1 or weight
  s.amt = {1, weighted(prompt, w), weighted(output, w)}  -- what this scope is charged per DIMS entry
  s.tot = weighted(prompt + output, w)
end

local worst = nil
local function fail(field, s, limit, need, avail, retry, fits)
  -- keep the worst refusal: one that can never fit, else the longest wait
  if worst and (worst[7] < fits or (worst[7] == fits and worst[6] >= retry)) then return end
  worst = {field, s.label or (s.name .. ' ' .. s.id), limit, need, avail, math.ceil(retry), fits}
end

local DIMS = {{'rpm', 'req', 'requests'}, {'input_tpm', 'in', 'tokens'}, {'output_tpm', 'out', 'tokens'}}
local hdr = {requests = {-1, -1, -1, 2}, tokens = {-1, -1, -1, 2}}
for _, s in ipairs(scopes) do
  s.rl = P .. ':rl:' .. s.base
  s.levels = {}
  local v = {}
  if s.lim.rpm >= 0 or s.lim.input_tpm >= 0 or s.lim.output_tpm >= 0 then
    v = redis.call('HMGET', s.rl, 'req', 'req_t', 'in', 'in_t', 'out', 'out_t')
  end
  for j, dim in ipairs(DIMS) do
    local cap = s.lim[dim[1]]
    if cap >= 0 then
      local lv = cap
      if v[2 * j - 1] then lv = math.min(cap, tonumber(v[2 * j - 1]) + (now - tonumber(v[2 * j])) * cap / 60000) end
      s.levels[dim[2]] = lv
      local need = s.amt[j]
      if need > cap then
        fail(dim[1], s, cap, need, math.floor(lv), 60000, 0)
      elseif need > lv then
        fail(dim[1], s, cap, need, math.floor(lv), (need - lv) * 60000 / cap, 1)
      end
    end
  end
  local ccap = s.lim.concurrency
  if ccap >= 0 then
    s.conc = P .. ':conc:' .. s.base
    redis.call('ZREMRANGEBYSCORE', s.conc, '-inf', now)
    local held = redis.call('ZCARD', s.conc)
    if held + 1 > ccap then fail('concurrency', s, ccap, 1, ccap - held, 1000, ccap > 0 and 1 or 0) end
  end
  s.budgets = {{'daily_tokens', P .. ':budget:' .. s.base .. ':d:' .. day, day_reset, 172800000},
               {'monthly_tokens', P .. ':budget:' .. s.base .. ':m:' .. month, month_reset, 2764800000}}
  for _, b in ipairs(s.budgets) do
    local cap = s.lim[b[1]]
    if cap >= 0 then
      local used = tonumber(redis.call('GET', b[2]) or '0')
      if used + s.tot > cap then
        fail(b[1], s, cap, s.tot, math.max(0, cap - used), b[3], s.tot <= cap and 1 or 0)
      end
    end
  end
end

local admitted = worst == nil
-- Headers: the tightest per-minute limit of each kind, after this request's debit if admitted.
for _, s in ipairs(scopes) do
  for j, dim in ipairs(DIMS) do
    local cap, lv = s.lim[dim[1]], s.levels[dim[2]]
    if lv then
      if admitted then lv = lv - s.amt[j] end
      local h = hdr[dim[3]]
      local ratio = cap > 0 and lv / cap or 0
      if ratio < h[4] then
        h[1], h[2], h[3], h[4] = cap, math.max(0, math.floor(lv)), cap > 0 and math.ceil((cap - lv) * 60000 / cap) or 0, ratio
      end
    end
  end
end
local headers = {hdr.requests[1], hdr.requests[2], hdr.requests[3], hdr.tokens[1], hdr.tokens[2], hdr.tokens[3]}
if not admitted then
  local out = {0}
  for i = 1, 7 do out[#out + 1] = worst[i] end
  for i = 1, 6 do out[#out + 1] = headers[i] end
  return reply(out)
end

for _, s in ipairs(scopes) do
  local fields = {}
  for j, dim in ipairs(DIMS) do
    local lv = s.levels[dim[2]]
    if lv then
      fields[#fields + 1] = dim[2]; fields[#fields + 1] = lv - s.amt[j]
      fields[#fields + 1] = dim[2] .. '_t'; fields[#fields + 1] = now
    end
  end
  if #fields > 0 then
    redis.call('HSET', s.rl, unpack(fields))
    redis.call('PEXPIRE', s.rl, 61000)
  end
  if s.conc then
    redis.call('ZADD', s.conc, now + lease_ms, rid)
    if redis.call('PTTL', s.conc) < lease_ms + 1000 then redis.call('PEXPIRE', s.conc, lease_ms + 1000) end
  end
  for _, b in ipairs(s.budgets) do
    if redis.call('INCRBY', b[2], s.tot) == s.tot then redis.call('PEXPIRE', b[2], b[4]) end
  end
end
local rk = P .. ':resv:' .. rid
redis.call('HSET', rk, 'tenant', tenant, 'kid', kid, 'model', model, 'weight', weight, 'prompt', prompt, 'output', output,
           'day', day, 'month', month, 'settled', 0, 'at', now)
redis.call('PEXPIRE', rk, resv_ttl)
local out = {1}
for i = 1, 6 do out[#out + 1] = headers[i] end
local leased = 0
for _, s in ipairs(scopes) do if s.conc then leased = 1 end end
out[#out + 1] = leased
return reply(out)
"""

# Admit a known principal. ARGV: 1 prefix, 2 tenant, 3 key id ('' for none), 4 reservation id,
# 5 prompt tokens, 6 output tokens, 7 lease ms, 8 reservation ttl ms, 9..14 the tier's limits (-1 = unlimited),
# 15 model id ('' or absent: no per-model scope), 16 its cost weight (absent: 1).
ADMIT = _CLOCK + _CALENDAR + """
local P, tenant, kid, rid = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local prompt, output = tonumber(ARGV[5]), tonumber(ARGV[6])
local lease_ms, resv_ttl = tonumber(ARGV[7]), tonumber(ARGV[8])
local defaults = {}
for i = 1, 6 do defaults[i] = tonumber(ARGV[8 + i]) end
local model, weight = ARGV[15] or '', tonumber(ARGV[16] or '1')
local function reply(out) return out end
""" + _ADMIT_BODY

# Authenticate and admit in one round trip: the key lookup of store.py (hash -> key record -> tenant),
# read on every request, so a revocation, suspension or end of rotation grace holds from the next one.
# ARGV: 1 prefix, 2 sha256 of the key, 3 reservation id, 4 prompt tokens, 5 output tokens, 6 lease ms,
#       7 reservation ttl ms, 8 model id ('' for none), 9 its cost weight, 10.. per tier: its name, then
#       its six limits; the default tier first.
# Returns {-1} for a key that must not authenticate (nothing is read further, nothing is charged),
# else the body's reply followed by: key id, tenant name, tenant id, tier name, cache salt, model list, aliases.
AUTH_ADMIT = _CLOCK + _CALENDAR + """
local P = ARGV[1]
local kid = redis.call('GET', P .. ':keyhash:' .. ARGV[2])
if not kid then return {-1} end
local key = redis.call('HMGET', P .. ':key:' .. kid, 'status', 'tenant_id', 'tenant')
if key[1] ~= 'active' or not key[3] then return {-1} end
local ten = redis.call('HMGET', P .. ':tenant:' .. key[3], 'id', 'tier', 'status', 'cache_salt', 'models', 'aliases')
-- a suspended tenant, or a deleted one (even if a new tenant took its name)
if ten[3] ~= 'active' or ten[1] ~= key[2] then return {-1} end
local tenant, rid = key[3], ARGV[3]
local prompt, output = tonumber(ARGV[4]), tonumber(ARGV[5])
local lease_ms, resv_ttl = tonumber(ARGV[6]), tonumber(ARGV[7])
local model, weight = ARGV[8], tonumber(ARGV[9])
local tier, at = ten[2] or '', 10  -- an unknown tier gets the default tier's limits, as in Python
for i = 10, #ARGV, 7 do
  if ARGV[i] == tier then at = i end
end
local defaults = {}
for i = 1, 6 do defaults[i] = tonumber(ARGV[at + i]) end
local function reply(out)
  for _, v in ipairs({kid, tenant, ten[1], tier, ten[4] or '', ten[5] or '*', ten[6] or ''}) do out[#out + 1] = v end
  return out
end
""" + _ADMIT_BODY

# ARGV: 1 prefix, 2 reservation id, 3 lease ms, 4 tenant, 5 key id ('' for none), 6 model id. Called only for a
# request that holds a lease and still runs. Returns 1 if its leases were extended, 2 if one was
# re-established (Redis restarted, lost the reservation, or the lease ran out during an outage), 0 if settled.
HEARTBEAT = _CLOCK + """
local P, rid, lease_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local rec = redis.call('HMGET', P .. ':resv:' .. rid, 'tenant', 'kid', 'settled', 'model')
if rec[3] == '1' then return 0 end
local tenant, kid, model = rec[1] or ARGV[4], rec[2] or ARGV[5], rec[4] or ARGV[6] or ''
local result = 1
local scopes = {'tenant:' .. tenant}
if kid ~= '' then scopes[#scopes + 1] = 'key:' .. kid end
if model ~= '' then scopes[#scopes + 1] = 'model:' .. tenant .. ':' .. model end
for _, base in ipairs(scopes) do
  local z = P .. ':conc:' .. base
  if not redis.call('ZSCORE', z, rid) then result = 2 end
  redis.call('ZADD', z, now + lease_ms, rid)
  if redis.call('PTTL', z) < lease_ms + 1000 then redis.call('PEXPIRE', z, lease_ms + 1000) end
end
return result
"""

# ARGV: 1 prefix, 2 reservation id, 3 prompt, 4 completion, 5 cached, 6 error (0|1), 7 settled ttl ms.
# Returns {status, charged_tokens, refunded_tokens}; status 1 settled now, 0 already settled, -1 unknown.
SETTLE = """
local P, rid = ARGV[1], ARGV[2]
local prompt, completion, cached, err = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local rk = P .. ':resv:' .. rid
local raw = redis.call('HGETALL', rk)
if #raw == 0 then return {-1, 0, 0} end
local r = {}
for i = 1, #raw, 2 do r[raw[i]] = raw[i + 1] end
if r.settled == '1' then return {0, 0, 0} end
local rp, ro = tonumber(r.prompt), tonumber(r.output)
-- Refunds are what was reserved and not used, never more than was reserved (in the scope's weighted tokens).
local back_in, back_out = math.max(0, rp - prompt), math.max(0, ro - completion)
local function weighted(n, w)
  if w == 1 or n == 0 then return n end  -- (ceil(-1e-6) would be "-0", not an integer to Redis)
  return math.ceil(n * w - 1e-6)
end
local scopes = {{'tenant:' .. r.tenant, tonumber(r.weight or '1')}}
if r.kid ~= '' then scopes[#scopes + 1] = {'key:' .. r.kid, scopes[1][2]} end
if (r.model or '') ~= '' then
  scopes[#scopes + 1] = {'model:' .. r.tenant .. ':' .. r.model, 1}
  redis.call('SADD', P .. ':usage:models:' .. r.tenant, r.model)  -- which models `usage show --by-model` reads
end
for _, sc in ipairs(scopes) do
  local base, w = sc[1], sc[2]
  local back_in = math.max(0, weighted(rp, w) - weighted(prompt, w))
  local back_out = math.max(0, weighted(ro, w) - weighted(completion, w))
  local delta = weighted(prompt + completion, w) - weighted(rp + ro, w)
  local rl = P .. ':rl:' .. base
  if back_in > 0 and redis.call('HEXISTS', rl, 'in') == 1 then redis.call('HINCRBYFLOAT', rl, 'in', back_in) end
  if back_out > 0 and redis.call('HEXISTS', rl, 'out') == 1 then redis.call('HINCRBYFLOAT', rl, 'out', back_out) end
  for _, bk in ipairs({P .. ':budget:' .. base .. ':d:' .. r.day, P .. ':budget:' .. base .. ':m:' .. r.month}) do
    if delta ~= 0 and redis.call('EXISTS', bk) == 1 then redis.call('INCRBY', bk, delta) end
  end
  redis.call('ZREM', P .. ':conc:' .. base, rid)
  local uk = P .. ':usage:' .. base .. ':' .. r.day
  redis.call('HINCRBY', uk, 'requests', 1)
  redis.call('HINCRBY', uk, 'prompt_tokens', prompt)
  redis.call('HINCRBY', uk, 'completion_tokens', completion)
  if cached > 0 then redis.call('HINCRBY', uk, 'cached_tokens', cached) end
  if err > 0 then redis.call('HINCRBY', uk, 'errors', err) end
end
redis.call('HSET', rk, 'settled', 1, 'prompt_used', prompt, 'completion_used', completion)
redis.call('PEXPIRE', rk, tonumber(ARGV[7]))
return {1, prompt + completion, back_in + back_out}
"""
