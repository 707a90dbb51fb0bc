"""SpacemiT IME2 (the K3's A100 cores, VLEN 1024, `XSMTVDotII`): instruction encodings (encoding.py).

Not a code-generation target yet: nothing registers it in imegen.targets. docs/ime2-isa.md has the
facts these modules rely on."""
