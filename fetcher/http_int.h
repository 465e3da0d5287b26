/* http_int.h — HTTP pieces shared by the blocking client (hub.c) and the
 * multi transfers (xfer_curl.c).  Private to fetcher/.
 *
 * Owns: reading the response headers the fetcher cares about, the wait
 * hint (RateLimit t= / Retry-After), the strict 206 check, mapping a Hub or
 * CDN error answer to a code and a what-to-do message, the request headers
 * (identity encoding, the token only to the endpoint's origin), the
 * User-Agent, the expiry of a signed CDN URL, and libcurl error mapping.
 * Nothing here does I/O.
 */
#ifndef SHOAL_FETCHER_HTTP_INT_H
#define SHOAL_FETCHER_HTTP_INT_H

#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "common/err.h"
#include "fetcher/hub.h"

/* Headers of the current response.  Reset at each status line, so after a
 * transfer they belong to the last response. */
typedef struct http_headers {
    char commit[64];
    char linked_etag[HUB_ETAG_MAX + 8];
    char etag[HUB_ETAG_MAX + 8];
    char linked_size[32];
    char content_length[32];
    char content_range[128];
    char location[HUB_URL_MAX];
    char error_code[64];
    char error_message[256];
    char retry_after[32];
    char ratelimit[128];
    int  too_long;            /* a header we need did not fit */
} http_headers;

/* Feed one raw header line as libcurl hands it (status lines reset h). */
void http_headers_line(http_headers *h, const char *data, size_t len);

/* Unsigned decimal, the whole string.  0 or -1. */
int http_parse_u64(const char *s, uint64_t *out);
/* Seconds to wait from "RateLimit: ...;t=N" (preferred) or Retry-After:
 * N; -1 if neither. */
long http_wait_hint(const http_headers *h);
/* Strip W/ and quotes.  0 or -1 (empty or too long). */
int http_etag_clean(const char *in, char *out, size_t cap);
/* 40 lowercase hex digits. */
int http_is_commit(const char *s);

/* Is this the answer to Range: bytes=first-last of a total-byte file?
 * 0: a 206 with Content-Range exactly "bytes first-last/total" and
 * Content-Length exactly last-first+1.  SHOAL_EPROTO (refused, reason in
 * err) for a 200 (Range ignored), another Content-Range or length.  1: not
 * a 2xx answer at all (map it with http_status_error). */
int http_range_check(long status, const http_headers *h, uint64_t first, uint64_t last,
                     uint64_t total, shoal_err *err);

/* Map an error answer to a code and a message that says what to do.
 * repo/rev/file may be NULL (CDN requests); has_token: whether the
 * request carried the token. */
int http_status_error(int status, const http_headers *h, const char *endpoint, int has_token,
                      const char *url, const char *repo, const char *rev, const char *file,
                      shoal_err *err);

/* Is a status worth retrying (408, 429, 5xx)? */
int http_status_retryable(long status);

/* CURLcode -> SHOAL_E*. */
int http_curl_code_map(CURLcode cc);
/* What to say for a failed transfer: errbuf (CURLOPT_ERRORBUFFER, may be
 * NULL or empty) or libcurl's text, except for what libcurl calls "Out of
 * memory" when an answer's header line is past its 100 KB limit
 * (CURL_MAX_HTTP_HEADER), which is named as such. */
const char *http_curl_strerror(CURLcode cc, const char *errbuf);
/* 1 for the failures that say the host cannot be reached at all (refused,
 * no such host): the caller gives up soon with SHOAL_EOFFLINE instead of
 * retrying for a minute (docs/fetcher.md, "Offline"). */
int http_curl_unreachable(CURLcode cc);
/* Attempts at an unreachable host before SHOAL_EOFFLINE. */
#define HTTP_UNREACHABLE_ATTEMPTS 2

/* "shoal/<version>; libcurl/<version>" into out. */
void http_user_agent(char *out, size_t cap);

/* Request headers: Accept-Encoding: identity, and auth_line
 * ("Authorization: Bearer ...") only when url has endpoint's origin.
 * Caller frees with curl_slist_free_all; NULL when out of memory.
 * *sent_token says whether the token went in. */
struct curl_slist *http_request_headers(const char *url, const char *endpoint,
                                        const char *auth_line, int *sent_token);

/* Wall-clock ms when a signed URL expires, from "Expires=<epoch>" or
 * "X-Amz-Date=<YYYYMMDDTHHMMSSZ>&X-Amz-Expires=<s>"; 0 if unknown. */
int64_t http_url_expiry_ms(const char *url);

#endif
