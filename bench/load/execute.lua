-- wrk script for bench/load.sh: POST /v1/sessions/{id}/execute {"code":"1+1"} over the session
-- ids given after `--`, counting responses by status code and 200 replies whose body is not a
-- successful `1+1` execution. `done` prints `@@ key value` lines that bench/load.sh parses.
--
--   wrk -t2 -c100 -d60s --timeout 60s -s bench/load/execute.lua http://127.0.0.1:PORT -- MODE ID...
--
-- MODE `rr`: every request goes to the next session (round-robin per wrk thread).
-- MODE `pinned`: wrk thread i only uses session i (run as many threads as sessions), so a
-- session never has more requests in flight than its thread has connections.

local threads = {}
local next_thread = 0

function setup(thread)
  thread:set("index", next_thread)
  next_thread = next_thread + 1
  table.insert(threads, thread)
end

local requests = {}
local turn = 0
local pinned = false
statuses = {}
bad_bodies = 0

function init(args)
  local mode = args[1]
  if (mode ~= "rr" and mode ~= "pinned") or #args < 2 then
    error("execute.lua: pass `rr|pinned ID...` after `--`")
  end
  pinned = mode == "pinned"
  local headers = { ["Content-Type"] = "application/json", ["Accept"] = "application/json" }
  local body = '{"code":"1+1"}'
  for i = 2, #args do
    requests[#requests + 1] =
      wrk.format("POST", "/v1/sessions/" .. args[i] .. "/execute", headers, body)
  end
  -- Round-robin threads start at different sessions so they do not walk the list in step;
  -- pinned threads stay on their own.
  turn = pinned and (index or 0) or (index or 0) * 7
end

function request()
  if not pinned then
    turn = turn + 1
  end
  return requests[(turn % #requests) + 1]
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if status == 200 then
    -- The Execution of `1+1`: status ok and the main result "2".
    if not (string.find(body, '"status":"ok"', 1, true)
        and string.find(body, '"text/plain":"2"', 1, true)) then
      bad_bodies = bad_bodies + 1
    end
  end
end

function done(summary, latency, _)
  local function out(k, v) io.write(string.format("@@ %s %s\n", k, tostring(v))) end
  out("requests", summary.requests)
  out("duration_us", summary.duration)
  out("bytes", summary.bytes)
  out("err_connect", summary.errors.connect)
  out("err_read", summary.errors.read)
  out("err_write", summary.errors.write)
  out("err_timeout", summary.errors.timeout)
  out("err_status", summary.errors.status)
  out("lat_min_us", latency.min)
  out("lat_mean_us", string.format("%.0f", latency.mean))
  for _, p in ipairs({ 50, 90, 99 }) do
    out("lat_p" .. p .. "_us", latency:percentile(p))
  end
  out("lat_max_us", latency.max)
  local total, bad = {}, 0
  for _, t in ipairs(threads) do
    for code, n in pairs(t:get("statuses") or {}) do
      total[code] = (total[code] or 0) + n
    end
    bad = bad + (t:get("bad_bodies") or 0)
  end
  for code, n in pairs(total) do
    out("status_" .. code, n)
  end
  out("bad_bodies", bad)
end
