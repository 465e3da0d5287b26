/* safetensors.h — moved to common/safetensors.h (the engine needs it and
 * never links the fetcher).  This forwarder is removed once nothing
 * includes it. */
#include "common/safetensors.h"
