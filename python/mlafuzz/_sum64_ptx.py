"""The device checksum the torch worker runs after each kernel: one launch for all cached inputs.

The worker keeps the inputs it has seen on the device (DeviceCache) and checks, after each call,
that the kernel did not write them (a written input would spoil every later call that reuses it).
The check is a sum modulo 2^64 of each input's 64-bit words, compared with the sum taken when the
input was copied. With torch that is one ``torch.sum`` per input, tens of microseconds of host
time each in a bridge call on the H200's host; this kernel sums up to four buffers in one launch
through the driver API (CudaDriver.sum64), loaded from the PTX below by the driver's JIT (no
compiler at run time). The sum is the same number torch.sum of the int64 words gives (addition
modulo 2^64 is associative and commutative), whatever order the blocks add in.

Written by hand for mlafuzz (PTX ISA 7.0, sm_70 and later); tests/python/test_sum64_ptx.py
assembles it with ptxas for sm_90 and sm_120 where the CUDA toolkit is installed.
"""

# mlafuzz_sum64(src0, n0, ..., src3, n3, dst): dst[y] += the sum modulo 2^64 of the n_y 64-bit
# words at src_y, for y = blockIdx.y in 0..3. blockDim.x is a multiple of 32, any grid.x; the
# caller zeroes dst[0..gridDim.y). Each thread sums a grid-stride slice, the warp reduces it with
# shuffles (a 64-bit value as two 32-bit halves), lane 0 adds it into the block's shared sum and
# thread 0 adds that into dst[y] (red.global: no return value needed).

# One step of the warp's reduction: each lane adds the sum of the lane `lanes` above it.
_SHUFFLE_STEP = """\tmov.b64 {{%r6, %r7}}, %rd6;
\tshfl.sync.down.b32 %r8, %r6, {lanes}, 31, -1;
\tshfl.sync.down.b32 %r9, %r7, {lanes}, 31, -1;
\tmov.b64 %rd9, {{%r8, %r9}};
\tadd.u64 %rd6, %rd6, %rd9;
"""

SUM64_PTX = """.version 7.0
.target sm_70
.address_size 64

.visible .entry mlafuzz_sum64(
	.param .u64 src0, .param .u64 n0,
	.param .u64 src1, .param .u64 n1,
	.param .u64 src2, .param .u64 n2,
	.param .u64 src3, .param .u64 n3,
	.param .u64 dst)
{
	.reg .pred %p<4>;
	.reg .b32 %r<12>;
	.reg .b64 %rd<16>;
	.shared .align 8 .b64 block_sum;

	// This block's buffer: (src_y, n_y).
	mov.u32 %r1, %ctaid.y;
	ld.param.u64 %rd1, [src0];
	ld.param.u64 %rd2, [n0];
	setp.eq.u32 %p1, %r1, 1;
	@%p1 ld.param.u64 %rd1, [src1];
	@%p1 ld.param.u64 %rd2, [n1];
	setp.eq.u32 %p1, %r1, 2;
	@%p1 ld.param.u64 %rd1, [src2];
	@%p1 ld.param.u64 %rd2, [n2];
	setp.eq.u32 %p1, %r1, 3;
	@%p1 ld.param.u64 %rd1, [src3];
	@%p1 ld.param.u64 %rd2, [n3];
	cvta.to.global.u64 %rd1, %rd1;

	// i = blockIdx.x * blockDim.x + threadIdx.x, stepping by gridDim.x * blockDim.x.
	mov.u32 %r2, %tid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %ctaid.x;
	mov.u32 %r5, %nctaid.x;
	mul.wide.u32 %rd3, %r4, %r3;
	cvt.u64.u32 %rd4, %r2;
	add.u64 %rd3, %rd3, %rd4;
	mul.wide.u32 %rd5, %r5, %r3;
	mov.u64 %rd6, 0;
	setp.eq.u32 %p2, %r2, 0;
	@%p2 st.shared.u64 [block_sum], %rd6;
	bar.sync 0;

SUM_LOOP:
	setp.ge.u64 %p3, %rd3, %rd2;
	@%p3 bra SUM_DONE;
	shl.b64 %rd7, %rd3, 3;
	add.u64 %rd7, %rd1, %rd7;
	ld.global.nc.u64 %rd8, [%rd7];
	add.u64 %rd6, %rd6, %rd8;
	add.u64 %rd3, %rd3, %rd5;
	bra SUM_LOOP;

SUM_DONE:
	// The warp's 32 sums into lane 0 (each 64-bit value as two 32-bit shuffles).
""" + "".join(_SHUFFLE_STEP.format(lanes=lanes) for lanes in (16, 8, 4, 2, 1)) + """
	// Lane 0 of each warp into the block's sum, thread 0 into dst[y].
	and.b32 %r10, %r2, 31;
	setp.eq.u32 %p2, %r10, 0;
	@%p2 red.shared.add.u64 [block_sum], %rd6;
	bar.sync 0;
	setp.ne.u32 %p2, %r2, 0;
	@%p2 bra SUM_END;
	ld.shared.u64 %rd11, [block_sum];
	ld.param.u64 %rd12, [dst];
	cvta.to.global.u64 %rd12, %rd12;
	mul.wide.u32 %rd13, %r1, 8;
	add.u64 %rd12, %rd12, %rd13;
	red.global.add.u64 [%rd12], %rd11;
SUM_END:
	ret;
}
"""

SUM64_ENTRY = "mlafuzz_sum64"
SUM64_BUFFERS = 4  # buffers one launch sums (blockIdx.y)
SUM64_THREADS = 256  # threads per block
