-- Every numeric field of INFO lease, for prometheus-redis-exporter's
-- -script option (docs/observability.md, "Prometheus"):
--
--   prometheus-redis-exporter -redis.addr redis://host:6379 \
--     -script /usr/share/redis-lease/lease.lua
--
-- (where the Debian package installs this file; from a checkout,
-- deploy/prometheus/lease.lua).
--
-- The exporter reads INFO ALL, which leaves module sections out, and runs
-- this script on every scrape. Each field becomes
--   redis_script_values{key="lease_<field>"} <value>
-- and the grace period's reason one more, set to 1:
--   redis_script_values{key="lease_grace_reason_<reason>"} 1
-- (reason none, promoted, restart or no-data). The distributions come as
-- their figures, lease_<name>_<count|p50|p99|p999|max> (held, waited,
-- renew_margin; ms). Text fields (the version, the commit, the eviction
-- policy) are left out: a field is numeric when its value is written in
-- plain decimal digits (a commit such as 27e630641090 is not a number).
local result = {}
local info = redis.call("INFO", "lease")
for line in string.gmatch(info, "[^\r\n]+") do
  local name, value = string.match(line, "^(lease_[%w_]+):(.*)$")
  if name ~= nil then
    if name ~= "lease_git_commit" and string.match(value, "^%-?%d+%.?%d*$") ~= nil then
      table.insert(result, name)
      table.insert(result, value)
    elseif name == "lease_grace_reason" then
      table.insert(result, "lease_grace_reason_" .. value)
      table.insert(result, "1")
    end
  end
end
return result
