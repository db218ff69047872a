-- wrk script: POST a typical budget request (Llama 3.1 8B inference on an H100).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"workloads":[{"kind":"inference","model":{"source":"preset","id":"llama-3.1-8b"},"batch_size":8,"prompt_tokens":4096,"generated_tokens":512}],"device":{"source":"catalog","id":"h100-sxm5-80gb"}}'
