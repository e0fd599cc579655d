"""Applying batches: the workers' polling loops, reads, lanes, dispatch to handlers, the
handler context and its buffered writes, and the fenced commit of each batch."""
