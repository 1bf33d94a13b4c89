"""`air.channel.put` / `air.channel.get` in the AIR interpreter.

Channels. An AIR channel is a FIFO per channel index carrying a stream of elements: the gets on index i
receive, in order, the elements of the puts that reach i (one put may feed several gets, e.g. a put of four
tiles and four gets of one tile; a get may span puts of the same element type). A put on a channel with `broadcast_shape` reaches every index that equals its own on the
non-broadcast dimensions (a size-1 dimension fans out to the broadcast extent), e.g. `@a [8, 1]
{broadcast_shape = [8, 4]}`: a put on [i, 0] feeds the gets on [i, 0..3]. On the device producer and
consumers run concurrently; here ops run one after the other in program order (segment ops, then the herd
tiles one by one), so the interpreter needs an order in which every get finds its data: a put *copies* the
bytes it sends (snapshot at put time, as the DMA reads them then) into unbounded per-index FIFOs, and a get
pops from its own FIFO. This is faithful when each producer precedes its consumers in program order (our
GEMM: the segment's K loop puts every panel slice, then the herd's tiles each get their slices in K order):
the values received do not depend on timing, only on the put order per index, which is the same; the
device's bounded FIFO depth only makes the producer wait. A get on an empty FIFO (more gets than puts, or
a consumer placed before its producer) and puts left unconsumed when an air.segment / the function ends
(the device would hang) raise InterpError.
"""
from __future__ import annotations

import re
from collections import deque

import numpy as np

from multi_launch_builder.emulator.air_interp.values import InterpError, _operands


class ChannelOps:
    """The channel ops of `program._Compiler`: `self.channels` holds the declarations, `self._access` (MemoryOps)
    reads the buffer side, `self.state.fifos` the data in flight."""

    # -- air.channel.put / get ----------------------------------------------------------------------------
    def _channel(self, op):
        m = re.fullmatch(r"air\.channel\.(put|get)\s+@([\w$.\-]+)\s*\[(.*?)\]\s*\((.*)\)\s*:\s*\((.*)\)",
                         op.text.strip(), re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: unsupported {op.name} form (only the synchronous "
                              "`@chan[indices] (buf[offsets] [sizes] [strides]) : (type)` is)")
        kind, sym = m.group(1), m.group(2)
        if sym not in self.channels:
            raise InterpError(f"{op.where()}: air.channel.{kind} on undeclared channel @{sym}")
        size, bcast = self.channels[sym]
        indices = _operands(m.group(3))
        if indices and len(indices) != len(size):
            raise InterpError(f"{op.where()}: {len(indices)} indices for channel @{sym} of rank {len(size)}")
        access = self._access(op, m.group(4))
        state_ref = self

        def index_of(env) -> tuple[int, ...]:
            idx = tuple(int(f(env)) for f in indices) if indices else (0,) * len(size)
            return idx

        def put(env):
            idx = index_of(env)
            if any(not 0 <= v < d for v, d in zip(idx, size)):
                raise InterpError(f"{op.where()}: put on @{sym}{list(idx)} outside its bundle {list(size)}")
            s, si = access(env)
            item = (s.data[si].copy(), s.dtype, s.name)  # a put sends the bytes as they are now
            # destinations: size-1 dimensions fan out to the broadcast extent, the others keep the put index
            dims = [range(b) if d == 1 and b > 1 else (v,) for v, d, b in zip(idx, size, bcast)]
            fifos = state_ref.state.fifos
            for dest in np.ndindex(*[len(r) for r in dims]):
                key = (sym, tuple(r[i] for r, i in zip(dims, dest)))
                fifos.setdefault(key, deque()).append(item)
            st = state_ref.state.stats
            st.channel_puts += 1
            st.channel_put_bytes += item[0].nbytes

        def get(env):
            idx = index_of(env)
            if any(not 0 <= v < b for v, b in zip(idx, bcast)):
                raise InterpError(f"{op.where()}: get on @{sym}{list(idx)} outside its broadcast shape "
                                  f"{list(bcast)}")
            q = state_ref.state.fifos.get((sym, idx))
            if not q:
                raise InterpError(f"{op.where()}: get on @{sym}{list(idx)} finds no data: no put reached this "
                                  "index before it in program order (the device would wait forever)")
            d, di = access(env)
            # a channel is a stream: a get takes the next di.size elements, from one put or several, leaving
            # the rest of a larger put for the following gets (a put of n tiles feeds n gets of one tile)
            parts, need = [], di.size
            while need:
                if not q:
                    got = di.size - need
                    raise InterpError(f"{op.where()}: get of {di.size} elements into {d.name} on @{sym}{list(idx)} "
                                      f"finds only {got}: the puts before it in program order send too little "
                                      "(the device would wait forever)")
                data, dtype, src = q[0]
                if d.dtype != dtype:
                    raise InterpError(f"{op.where()}: channel @{sym} carries {dtype} from {src}, {d.name} is "
                                      f"{d.dtype}")
                if data.size <= need:
                    q.popleft()
                    parts.append(data)
                    need -= data.size
                else:
                    parts.append(data[:need])
                    q[0] = (data[need:], dtype, src)
                    need = 0
            d.data[di] = parts[0] if len(parts) == 1 else np.concatenate(parts)
            d.written = True
            state_ref.state.stats.channel_gets += 1
        return put if kind == "put" else get
