-- wrk script: every request a different budget (batch size counts up), so no answer repeats.
local counter = 0
request = function()
  counter = counter + 1
  local body = '{"workloads":[{"kind":"inference","model":{"source":"preset","id":"llama-3.1-8b"},"batch_size":'
    .. tostring(counter) .. ',"prompt_tokens":4096,"generated_tokens":512}],"device":{"source":"catalog","id":"h100-sxm5-80gb"}}'
  return wrk.format("POST", "/v1/budgets", {["Content-Type"] = "application/json"}, body)
end
