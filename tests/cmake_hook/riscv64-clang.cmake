# Cross toolchain: clang-19 for riscv64 Linux with Debian's GCC runtime; runs under QEMU user mode.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR riscv64)
set(CMAKE_C_COMPILER clang-19)
set(CMAKE_C_COMPILER_TARGET riscv64-linux-gnu)
set(CMAKE_C_FLAGS_INIT "--gcc-toolchain=/usr -march=rv64gcv -Wall -Wextra -Werror")
set(CMAKE_EXE_LINKER_FLAGS_INIT "--gcc-toolchain=/usr")
set(CMAKE_FIND_ROOT_PATH /usr/riscv64-linux-gnu)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-riscv64;-L;/usr/riscv64-linux-gnu;-cpu;rv64,v=true,Zfh=true,vlen=256)
