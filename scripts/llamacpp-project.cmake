# Read by llama.cpp's own project() when llama-cpp-python builds it (CMAKE_PROJECT_llama.cpp_INCLUDE, set by the
# Makefile's llamacpp-wheel). llama-cpp-python forces llama.cpp's common library on: the helpers of llama.cpp's own
# programs (argument parsing, chat-format parsers, an HTTP client), built and shipped in the wheel but never loaded by
# the Python binding, which loads libllama and ggml alone. Off, the wheel builds in about half the CPU time.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
