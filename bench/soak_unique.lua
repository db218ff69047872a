-- wrk script for the soak: every request a different body (budgets of four models and
-- llm_serving budgets, the batch size / max_model_len counting up from OFFSET), so no answer
-- repeats and the answer cache fills to its bound. OFFSET separates the warm-up from the soak.
local counter = tonumber(os.getenv("SOAK_OFFSET") or "0")
local models = {"llama-3.1-8b", "qwen2.5-7b", "mixtral-8x7b", "gemma-2-9b"}
request = function()
  counter = counter + 1
  local model = models[(counter % #models) + 1]
  local body
  if counter % 5 == 0 then
    body = '{"workloads":[{"kind":"llm_serving","model":{"source":"preset","id":"' .. model
      .. '"},"max_model_len":' .. tostring(1024 + counter % 7000)
      .. '}],"device":{"source":"catalog","id":"h100-sxm5-80gb"}}'
  else
    body = '{"workloads":[{"kind":"inference","model":{"source":"preset","id":"' .. model
      .. '"},"batch_size":' .. tostring(1 + counter % 1000000) .. ',"prompt_tokens":'
      .. tostring(512 + counter % 3) .. ',"generated_tokens":256}],'
      .. '"device":{"source":"catalog","id":"h100-sxm5-80gb"}}'
  end
  return wrk.format("POST", "/v1/budgets", {["Content-Type"] = "application/json"}, body)
end
