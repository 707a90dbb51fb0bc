/* The trap-and-emulate runtime a build names with -DIMEGEN_EMULATOR=NAME (runtime/NAME.c: ime_emu, the K1's IME
 * and the default; ime2_emu, the K3's IME2): its header, and emulator_install() / emulator_count() for its
 * imegen_NAME_install() / imegen_NAME_count(). */
#ifndef IMEGEN_EMULATOR_H
#define IMEGEN_EMULATOR_H

#ifndef IMEGEN_EMULATOR
#define IMEGEN_EMULATOR ime_emu
#endif
#define IMEGEN_CAT3_(a, b, c) a##b##c
#define IMEGEN_CAT3(a, b, c) IMEGEN_CAT3_(a, b, c)
#define IMEGEN_STR_(x) #x
#define IMEGEN_STR(x) IMEGEN_STR_(x)
#include IMEGEN_STR(IMEGEN_EMULATOR.h)
#define emulator_install IMEGEN_CAT3(imegen_, IMEGEN_EMULATOR, _install)
#define emulator_count IMEGEN_CAT3(imegen_, IMEGEN_EMULATOR, _count)

#endif
