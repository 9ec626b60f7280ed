-- Exports the `INFO lock` section through redis_exporter's -script option:
-- every field as redis_script_values{key="<field>"} (and the exporter adds
-- redis_script_result). Read-only: INFO only.
--
--   redis_exporter -redis.addr redis://127.0.0.1:6379 -script lock-metrics.lua
local out = {}
for line in string.gmatch(redis.call('INFO', 'lock'), '[^\r\n]+') do
  local k, v = string.match(line, '^(lock_[%w_]+):(-?%d+)$')
  if k then
    out[#out + 1] = k
    out[#out + 1] = v
  end
end
return out
