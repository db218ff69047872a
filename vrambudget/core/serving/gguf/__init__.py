"""llama.cpp and Ollama deployments of GGUF models: ggml tensor types (``types``), the tensor
types a named quantization gives each tensor (``recipe``), the buffers llama.cpp allocates per
device (``llamacpp``) and Ollama's defaults and own estimate (``ollama``)."""
