/* tok_pattern.c — pre-tokenizer patterns: the named ones, the translation
 * from tiktoken's regex dialect (Rust `regex`/`fancy-regex`) into PCRE2,
 * and compiling with JIT.
 *
 * Owns: the pattern texts and tokenizer_pattern_translate.  Does not own
 * matching (tokenizer.c).
 *
 * Why a translation: the patterns are written for Rust's regex crate, which
 * PCRE2 reads differently in two places that matter here:
 *  - class intersection `[A&&B]` (K3 uses it to keep Han out of the letter
 *    classes) does not exist in PCRE2, where `&&` would be two literal
 *    ampersands.  A one-character lookahead before the class gives the same
 *    set: the lookahead tests the very character the class then consumes.
 *  - a bare script name `\p{Han}` is Script=Han in Rust but
 *    Script_Extensions=Han in PCRE2 >= 10.40, which adds e.g. U+302A..302D
 *    (combining tone marks, Script=Inherited) and U+303C; `\p{sc:Han}` is
 *    the Rust meaning.
 * `\s` needs nothing: PCRE2's UCP \s is Unicode White_Space, as Rust's is.
 * Rejected: hand-editing the K3 pattern (the spec's text is kept verbatim
 * below so a reader can diff it against tokenization_kimi.py) and
 * expanding the classes into code point lists (ties us to one Unicode
 * version in two places).
 */
#include "engine/text/text_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* specs/k3.md §4, verbatim. */
static const char PAT_K3[] =
    "[\\p{Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

/* tiktoken's o200k_base (openai_public.py).  js-tiktoken spells the
 * case-insensitive contractions out as 's|'S|...; (?i:) also lets 's match
 * U+017F LATIN SMALL LETTER LONG S, as tiktoken's Rust regex does. */
static const char PAT_O200K[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

/* tiktoken's cl100k_base (the form js-tiktoken ships). */
static const char PAT_CL100K[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

#define MAX_OPERANDS 8

typedef struct tr {
    const char *s;
    size_t      n;
    shoal_buf  *o;
    shoal_err  *err;
} tr;

/* General categories (and PCRE2's own X.. properties) keep their name. */
static int is_gencat(const char *p, size_t n)
{
    static const char *const names[] = {
        "C", "Cc", "Cf", "Cn", "Co", "Cs", "L", "L&", "Ll", "Lm", "Lo", "Lt", "Lu", "LC",
        "M", "Mc", "Me", "Mn", "N", "Nd", "Nl", "No", "P", "Pc", "Pd", "Pe", "Pf", "Pi",
        "Po", "Ps", "S", "Sc", "Sk", "Sm", "So", "Z", "Zl", "Zp", "Zs", "Any", "Xan",
        "Xps", "Xsp", "Xwd", "Xuc",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && memcmp(names[i], p, n) == 0)
            return 1;
    return 0;
}

/* 1 if PCRE2 knows `name` as a script. */
static int is_script(const char *p, size_t n)
{
    char pat[96];
    int e;
    PCRE2_SIZE eo;
    pcre2_code *c;
    if (n == 0 || n > 64)
        return 0;
    memcpy(pat, "\\p{sc:", 6);
    memcpy(pat + 6, p, n);
    memcpy(pat + 6 + n, "}", 2);
    c = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &e, &eo, NULL);
    if (!c)
        return 0;
    pcre2_code_free(c);
    return 1;
}

/* Length of the escape starting at s[i] == '\\' (2, or through the '}' of
 * \p{..}, \x{..} and the like). */
static size_t escape_len(const tr *x, size_t i)
{
    if (i + 1 >= x->n)
        return 1;
    if (i + 2 < x->n && x->s[i + 2] == '{' && strchr("pPxoNgk", x->s[i + 1])) {
        const char *close = memchr(x->s + i + 2, '}', x->n - i - 2);
        if (close)
            return (size_t)(close - (x->s + i)) + 1;
    }
    return 2;
}

/* Copy the escape at s[i] (length len), renaming bare scripts. */
static int copy_escape(tr *x, size_t i, size_t len)
{
    const char *s = x->s + i;
    if (len > 4 && (s[1] == 'p' || s[1] == 'P') && s[2] == '{') {
        const char *name = s + 3;
        size_t nl = len - 4, neg = (nl && name[0] == '^');
        if (!memchr(name, ':', nl) && !memchr(name, '=', nl) && !is_gencat(name + neg, nl - neg) &&
            is_script(name + neg, nl - neg)) {
            int rc = shoal_buf_append(x->o, s, 3);
            if (!rc && neg)
                rc = shoal_buf_append(x->o, "^", 1);
            if (!rc)
                rc = shoal_buf_append_str(x->o, "sc:");
            if (!rc)
                rc = shoal_buf_append(x->o, name + neg, nl - neg);
            return rc ? rc : shoal_buf_append(x->o, "}", 1);
        }
    }
    return shoal_buf_append(x->o, s, len);
}

/* Copy s[a..b), renaming scripts in escapes. */
static int copy_span(tr *x, size_t a, size_t b)
{
    int rc = 0;
    while (a < b && rc == 0) {
        if (x->s[a] == '\\') {
            size_t l = escape_len(x, a);
            if (a + l > b)
                l = b - a;
            rc = copy_escape(x, a, l);
            a += l;
        } else {
            size_t c = a;
            while (c < b && x->s[c] != '\\')
                c++;
            rc = shoal_buf_append(x->o, x->s + a, c - a);
            a = c;
        }
    }
    return rc;
}

/* Scan the class opening at s[i] == '['.  Sets *end one past its ']' and
 * the top-level && split points.  -1 if unbalanced. */
static int class_scan(const tr *x, size_t i, size_t *end, size_t *splits, int *n_splits)
{
    size_t body;
    i++;
    if (i < x->n && x->s[i] == '^')
        i++;
    body = i;
    if (n_splits)
        *n_splits = 0;
    while (i < x->n) {
        char c = x->s[i];
        if (c == '\\') {
            i += escape_len(x, i);
        } else if (c == '[' && i + 1 < x->n && x->s[i + 1] == ':') {
            const char *close = strstr(x->s + i + 2, ":]");
            if (!close || (size_t)(close - x->s) >= x->n)
                return -1;
            i = (size_t)(close - x->s) + 2;
        } else if (c == '[') {
            size_t e;
            if (class_scan(x, i, &e, NULL, NULL))
                return -1;
            i = e;
        } else if (c == ']' && i > body) {
            *end = i + 1;
            return 0;
        } else if (c == '&' && i + 1 < x->n && x->s[i + 1] == '&' && n_splits) {
            if (*n_splits >= MAX_OPERANDS - 1)
                return -1;
            splits[(*n_splits)++] = i;
            i += 2;
        } else {
            i++;
        }
    }
    return -1;
}

/* Emit operand s[a..b) as one PCRE2 class.  *negated says whether it was a
 * single negated nested class [^X], emitted then as [X]. */
static int emit_operand(tr *x, size_t a, size_t b, int strip_negation)
{
    size_t e;
    int rc;
    if (a < b && x->s[a] == '[' && class_scan(x, a, &e, NULL, NULL) == 0 && e == b) {
        if (strip_negation && x->s[a + 1] == '^') {
            if ((rc = shoal_buf_append(x->o, "[", 1)) || (rc = copy_span(x, a + 2, b)))
                return rc;
            return 0;
        }
        return copy_span(x, a, b);
    }
    if ((rc = shoal_buf_append(x->o, "[", 1)) || (rc = copy_span(x, a, b)))
        return rc;
    return shoal_buf_append(x->o, "]", 1);
}

static int is_negated_class(const tr *x, size_t a, size_t b)
{
    size_t e;
    return b - a > 3 && x->s[a] == '[' && x->s[a + 1] == '^' &&
           class_scan(x, a, &e, NULL, NULL) == 0 && e == b;
}

/* Translate the class at s[i]; *next is set past it. */
static int translate_class(tr *x, size_t i, size_t *next)
{
    size_t end, splits[MAX_OPERANDS], a[MAX_OPERANDS], b[MAX_OPERANDS];
    int ns, rc = 0, neg = i + 1 < x->n && x->s[i + 1] == '^';

    if (class_scan(x, i, &end, splits, &ns))
        return shoal_err_set(x->err, SHOAL_EINVAL, "pattern: unbalanced or too complex class at offset %zu", i);
    *next = end;
    if (ns == 0)
        return copy_span(x, i, end);
    a[0] = i + 1 + (size_t)neg;
    for (int k = 0; k < ns; k++) {
        b[k] = splits[k];
        a[k + 1] = splits[k] + 2;
    }
    b[ns] = end - 1;
    rc = shoal_buf_append_str(x->o, neg ? "(?:(?!" : "(?:");
    for (int k = 1; k <= ns && rc == 0; k++) {
        int nc = is_negated_class(x, a[k], b[k]);
        rc = shoal_buf_append_str(x->o, nc ? "(?!" : "(?=");
        if (!rc)
            rc = emit_operand(x, a[k], b[k], nc);
        if (!rc)
            rc = shoal_buf_append(x->o, ")", 1);
    }
    if (!rc)
        rc = emit_operand(x, a[0], b[0], 0);
    if (!rc)
        rc = shoal_buf_append_str(x->o, neg ? ")(?s:.))" : ")");
    return rc;
}

int tokenizer_pattern_translate(const char *src, char **out, shoal_err *err)
{
    shoal_buf o;
    tr x = { src, strlen(src), &o, err };
    size_t i = 0;
    int rc = 0;

    *out = NULL;
    shoal_buf_init(&o, 0);
    while (i < x.n && rc == 0) {
        char c = src[i];
        if (c == '\\') {
            size_t l = escape_len(&x, i);
            rc = copy_escape(&x, i, l);
            i += l;
        } else if (c == '[') {
            rc = translate_class(&x, i, &i);
        } else {
            rc = shoal_buf_append(&o, &src[i], 1);
            i++;
        }
    }
    if (rc == 0 && (rc = shoal_buf_append(&o, "", 0)) == 0 && o.data) {
        *out = (char *)shoal_buf_take(&o, NULL);
        return 0;
    }
    if (rc == 0)
        rc = shoal_err_set(err, SHOAL_EINVAL, "empty pattern");
    else if (rc == SHOAL_ENOMEM)
        shoal_err_set(err, rc, "out of memory translating the pattern");
    shoal_buf_free(&o);
    return rc;
}

int tokenizer_pattern_resolve(const char *pattern, char **out, shoal_err *err)
{
    const char *src = pattern;
    *out = NULL;
    if (!pattern || !pattern[0])
        return shoal_err_set(err, SHOAL_EINVAL, "empty pre-tokenizer pattern");
    if (strcmp(pattern, "k3") == 0)
        src = PAT_K3;
    else if (strcmp(pattern, "o200k") == 0 || strcmp(pattern, "o200k_base") == 0)
        src = PAT_O200K;
    else if (strcmp(pattern, "cl100k") == 0 || strcmp(pattern, "cl100k_base") == 0)
        src = PAT_CL100K;
    return tokenizer_pattern_translate(src, out, err);
}

int tok_regex_compile(tokenizer *t, shoal_err *err)
{
    int e;
    PCRE2_SIZE eo;
    t->re = pcre2_compile((PCRE2_SPTR)t->pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &e,
                          &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(e, msg, sizeof msg);
        return shoal_err_set(err, SHOAL_EINVAL, "pattern: %s at offset %zu of '%s'", (char *)msg,
                             (size_t)eo, t->pattern);
    }
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    if (!t->jit)
        LOG_DEBUG("tokenizer", "PCRE2 JIT unavailable; using the interpreter");
    return 0;
}
