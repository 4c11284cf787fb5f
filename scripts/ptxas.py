#!/usr/bin/env python3
"""Compiles one kernels/*.cu file as the CUDA backend does (common.cuh and route.cuh spliced in
where the file includes them, NVRTC, --std=c++17) for an architecture (default sm_90a) on a
machine without a GPU, then prints ptxas's resource report (registers, stack, spills) of every
kernel, and with --sass NAME the SASS of kernel NAME. For checking a kernel change before
spending device time, and that a refactor leaves a kernel's SASS as it was.

Needs NVIDIA's pip wheels (the CUDA toolkit is not needed):
    python3 -m venv /tmp/cu && /tmp/cu/bin/pip install nvidia-cuda-nvrtc nvidia-cuda-nvcc \\
        nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    /tmp/cu/bin/python scripts/ptxas.py kernels/gemm.cu [--arch sm_90a] [--sass NAME]
The PTX goes to /tmp/NAME.ptx and the cubin to /tmp/NAME.cubin. The wheels' toolkit may be
newer than a device's driver: the SASS here is ptxas's for that toolkit, not what the
device's driver JIT makes of NVRTC's PTX."""
import argparse, ctypes, glob, os, subprocess, sys

def tool(pattern):
    hits = glob.glob(os.path.join(sys.prefix, "lib/python3*/site-packages/nvidia/cu*/" + pattern))
    if not hits:
        sys.exit(f"ptxas.py: {pattern} not found under {sys.prefix}; install the wheels (see --help)")
    return hits[0]

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--sass", metavar="NAME")
    args = ap.parse_args()
    src = open(args.file).read()
    lines = src.split("\n")
    name = os.path.basename(args.file)
    # the headers the CUDA backend splices in (executor/src/cuda/compile.rs), each in place of
    # its include line
    headers = ("common.cuh", "route.cuh")
    if not any(l.strip() == '#include "common.cuh"' for l in lines):
        sys.exit(f'ptxas.py: {args.file} has no line #include "common.cuh"')
    for at, line in enumerate(lines):
        for h in headers:
            if line.strip() == f'#include "{h}"':
                text = open(os.path.join(os.path.dirname(args.file), h)).read()
                lines[at] = f'#line 1 "{h}"\n{text}\n#line {at + 2} "{name}"'
    nvrtc = ctypes.CDLL(tool("lib/libnvrtc.so*"))
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), "\n".join(lines).encode(), name.encode(), 0, None, None):
        sys.exit("ptxas.py: nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={args.arch}".encode(), b"--std=c++17"]
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    print(log.value.decode(), end="")
    if rc:
        sys.exit(f"ptxas.py: nvrtc could not compile {args.file} for {args.arch}")
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    stem = os.path.splitext(name)[0]
    ptx_path, cubin = f"/tmp/{stem}.ptx", f"/tmp/{stem}.cubin"
    open(ptx_path, "wb").write(ptx.value)
    r = subprocess.run([tool("bin/ptxas"), f"-arch={args.arch}", "-v", ptx_path, "-o", cubin],
                       capture_output=True, text=True)
    print(r.stdout + r.stderr, end="")
    if r.returncode:
        sys.exit(r.returncode)
    if args.sass:
        env = dict(os.environ, PATH=os.path.dirname(tool("bin/nvdisasm")) + ":" + os.environ["PATH"])
        subprocess.run([tool("bin/cuobjdump"), "-sass", "-fun", args.sass, cubin], env=env, check=True)

main()
