/* fetcher.h — the fetcher component's public interface (umbrella header).
 *
 * The fetcher talks to the Hugging Face Hub (or a mirror, or hubmock).
 * libcurl is used only inside fetcher/; no libcurl type appears in these
 * headers.  The safetensors header parser it uses lives in common/
 * (common/safetensors.h) because the engine reads local snapshot
 * directories too and never links the fetcher.
 *
 *   fetcher/hub.h          resolve a file on a Hub and GET byte ranges
 *                          (blocking; used for metadata)
 *   fetcher/fetch.h        upstreams, the model manifest, range transfers
 *                          into the cache driven by any event loop
 */
#ifndef SHOAL_FETCHER_H
#define SHOAL_FETCHER_H

#include "common/safetensors.h"
#include "fetcher/hub.h"
#include "fetcher/fetch.h"

#endif
