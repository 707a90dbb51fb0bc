"""llama.cpp's real SpacemiT IME1 Q4_0 kernels, counted like imegen's own (the bench's `llama.cpp real`
rows): the sources from the llama-cpp-python sdist (source), built with imegen's driver around ime.cpp's
loop (build, llama_driver.cpp, llama_loop.cpp), checked against NumPy (check), counted per thread at
full shapes (counts), and modeled next to imegen's like-for-like config (rows)."""
