"""Every size the wire protocol accepts from a peer, as a named constant with the reason for its value.

A peer is untrusted until it has proven knowledge of the job secret, and even afterwards a bug on its side
must not be able to exhaust our memory. So every length or count read from the wire is compared with one of
these limits *before* anything of that size is allocated: the fixed frame header is checked before its body
is buffered, msgpack is told the longest string/array/map it may build, and payload sizes are checked before
arrays are created. A :class:`~wanrt.protocol.config.ProtocolConfig` may lower (never raise) the frame
limits for one connection.
"""

from __future__ import annotations

from typing import Final

#: Length of the fixed, struct-encoded frame header (see docs/protocol.md). Not a tunable.
FIXED_HEADER_BYTES: Final = 24

#: Raw buffers start at this alignment inside a frame, so fp32/int64 views need no realignment copy.
BUFFER_ALIGNMENT: Final = 8

#: Largest whole frame (fixed header + msgpack header + padding + buffers). Sized for the biggest single-layer
#: payload we ship in one piece: a 32 Mi-element layer sent uncompressed in fp32 (128 MiB) plus block
#: indices, with room to spare. Anything larger must be compressed harder or split into several layers; it
#: also bounds what one Chunk-reassembled item may grow to. Fits the u32 body-length field.
MAX_FRAME_BYTES: Final = 256 * 1024 * 1024

#: Largest frame accepted before the peer has authenticated. A Hello/Welcome/Auth/Reject is a few hundred
#: bytes plus the small info map; an unauthenticated stranger must not make us allocate more than this.
MAX_HANDSHAKE_FRAME_BYTES: Final = 16 * 1024

#: Largest msgpack header map. Headers hold field values and buffer lengths only (tensor data travels out of
#: band), so 64 KiB is generous even for an Aggregate listing MAX_SITES site names.
MAX_HEADER_BYTES: Final = 64 * 1024

#: Raw buffers per frame. A COO payload needs two (indices, values); a few spare for future codecs.
MAX_BUFFERS_PER_MESSAGE: Final = 8

#: Longest string inside a header (names, reasons, config values), so msgpack never builds a huge str.
MAX_STR_CHARS: Final = 1024

#: Longest bytes value inside a header (nonces, proofs, opaque info values).
MAX_BIN_BYTES: Final = 1024

#: Longest msgpack array / map inside a header. Bounds list/dict preallocation by the msgpack decoder.
MAX_HEADER_ARRAY_LEN: Final = 1024

#: Longest identifier (job, site, metric and config key names): short enough to use as log fields and
#: metric labels.
MAX_NAME_CHARS: Final = 64

#: Length of the handshake nonces. 256 bits make a collision (and so a replay) practically impossible.
NONCE_BYTES: Final = 32

#: Shortest accepted pre-shared job secret. A recorded handshake lets an attacker test guesses offline, so
#: a key below 128 bits could be brute-forced.
MIN_SECRET_BYTES: Final = 16

#: Longest accepted secret (HMAC hashes longer keys anyway; this just rejects a mistaken file path or blob).
MAX_SECRET_BYTES: Final = 4096

#: Protocol versions offered in a Hello, at most. Negotiation needs a handful, not thousands.
MAX_VERSIONS: Final = 16

#: Entries in the opaque Hello/Welcome ``info`` map (model signature, current iteration, build id ...).
MAX_INFO_KEYS: Final = 32

#: Sites in one job (Aggregate.sites, contribution ids). WAN jobs span a few clusters, but federated-style
#: jobs of many small sites exist and the simulator runs 1 000-site trees on this very protocol; 1024 is as
#: far as a header array may go (MAX_HEADER_ARRAY_LEN), and 1024 names of <= 63 bytes fit MAX_HEADER_BYTES.
MAX_SITES: Final = 1024

#: Metrics in one Telemetry message: a gateway reports tens (rates, idle %, queue depths ...).
MAX_TELEMETRY_KEYS: Final = 256

#: Settings in one ConfigUpdate: compression rate, batch sizes per site, staleness ... tens at most.
MAX_CONFIG_KEYS: Final = 256

#: Value slots (nnz_blocks * block_size) in one payload: as many fp32 values as fit in a maximal frame.
MAX_PAYLOAD_ELEMENTS: Final = MAX_FRAME_BYTES // 4

#: Largest dense length of one layer. Kernels index layers with int64 but scatter into dense buffers of this
#: size; 2**31 elements (8 GiB fp32) is beyond any single layer we train, and a lying peer must not make a
#: receiver allocate more than that on ``to_dense``.
MAX_LAYER_ELEMENTS: Final = 2**31 - 1

#: Largest value of iteration / heartbeat sequence numbers and Chunk item ids (fits int64 everywhere).
MAX_COUNTER: Final = 2**63 - 1

#: Largest layer id and round number (fits u32; models have thousands of layers, rounds per iteration few).
MAX_LAYER_ID: Final = 2**32 - 1

#: Chunked items being reassembled at once on one connection. A gateway's EDF queue interleaves the chunks
#: of a handful of layers at a time; a peer opening more is misbehaving and would pin memory.
MAX_PARTIAL_ITEMS: Final = 16

#: Bytes held by partially reassembled items on one connection, summed. Two maximal frames in flight.
MAX_REASSEMBLY_BYTES: Final = 2 * MAX_FRAME_BYTES

#: Smallest chunk a sender may cut: below this the per-frame overhead (24 + ~40 bytes) dominates.
MIN_CHUNK_BYTES: Final = 1024

#: Data shards listed in one ShardGrant / ShardDone: a rank leases a few at a time (AntDT §IV-C: a worker
#: cannot fetch new shards before it completes its current one), so 64 is plenty and keeps a header small.
MAX_SHARDS_PER_MESSAGE: Final = 64

#: Ranks per site a shard lease may name: far beyond any site's GPU count, small enough for a log field.
MAX_RANK: Final = 1 << 16

#: Samples in one dataset (shard ids and sample offsets are bounded by it): 2**40 records.
MAX_SAMPLES: Final = 1 << 40
