"""The undefined symbols of a 64-bit Mach-O file that no library provides, read from its symbol table: what a
link with `-undefined dynamic_lookup` left for the loader to find at run time (tools/cross.py checks them by
name). The symbols a library provides are bound to it (their library ordinal, the high byte of n_desc, is its
index among the file's libraries); the others have none: 0 as zig's linker writes it, 0xFE (flat lookup) as
Apple's ld64 does."""
from __future__ import annotations

import struct
from pathlib import Path

MH_MAGIC_64 = 0xFEEDFACF
LC_SYMTAB = 0x2
N_EXT, N_TYPE, N_UNDF = 0x01, 0x0E, 0x00
UNBOUND_ORDINALS = (0x00, 0xFE)


def unbound_symbols(path) -> list:
    data = Path(path).read_bytes()
    magic, _, _, _, ncmds, _, _, _ = struct.unpack_from("<IiiIIIII", data, 0)
    if magic != MH_MAGIC_64:
        raise ValueError(f"{path} is not a 64-bit little-endian Mach-O file")
    offset = 32  # mach_header_64
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, offset)
        if cmd == LC_SYMTAB:
            symoff, nsyms, stroff, _ = struct.unpack_from("<IIII", data, offset + 8)
            names = []
            for k in range(nsyms):  # nlist_64
                strx, ntype, _, desc, _ = struct.unpack_from("<IBBHQ", data, symoff + 16 * k)
                if ntype & N_TYPE == N_UNDF and ntype & N_EXT and desc >> 8 in UNBOUND_ORDINALS:
                    start = stroff + strx
                    names.append(data[start:data.index(b"\0", start)].decode())
            return sorted(names)
        offset += size
    raise ValueError(f"{path} has no symbol table")
