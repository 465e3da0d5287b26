/* fetcher.h — the fetcher component's public interface (umbrella header).
 *
 * The fetcher talks to the Hugging Face Hub (or a mirror, or hubmock) and
 * reads safetensors headers.  libcurl is used only inside fetcher/; no
 * libcurl type appears in these headers.
 *
 *   fetcher/safetensors.h  parse and validate a safetensors header
 *   fetcher/hub.h          resolve a file on a Hub and GET byte ranges
 *                          (blocking; the libevent-driven multi transfers of
 *                          a later stage build on it)
 */
#ifndef SHOAL_FETCHER_H
#define SHOAL_FETCHER_H

#include "fetcher/safetensors.h"
#include "fetcher/hub.h"

#endif
