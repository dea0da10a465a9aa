"""What differs per server: which page is a server's (pages), and the servers whose numbers need more than the
probe spec's mapping (TensorRT-LLM's JSON iteration stats, llama.cpp's /props)."""
