/* The JSON field passes of the encryption plugin's compiled module (see _aead.c): a validating
 * scan of a record's JSON value that finds the listed fields (sealing) or the text envelopes of
 * every field or the listed ones, with each one's label (opening), and splices the new text in.
 * Anything it does not read as orjson would, or any opening that is not clean, it leaves to the
 * Python pass (Ellipsis, or the run of records cut short). Client bytes: every read is bounded. */
#include "aead.h"

#define MAX_FIELDS 63 /* bits of a uint64_t mask, shifts below 64 */
#define MAX_DEPTH 64
#define MAX_FOUND 64

/* A field to seal: its steps (a key: its UTF-8 bytes; an index), its AEAD, envelope header, and the
 * AAD up to the record's identity. */
typedef struct {
    Py_ssize_t nsteps;
    const char **key; /* key[i] NULL: step i is an index */
    Py_ssize_t *len;  /* key length, or the index */
    Aead *aead;
    const unsigned char *header;
    Py_ssize_t hlen;
    const unsigned char *aad;
    Py_ssize_t alen;
} field_t;

typedef struct {
    Py_ssize_t start, end; /* the value's bytes (sealing), the string's with its quotes (opening) */
    int field;
    Py_ssize_t clear, clear_len; /* opening: the plaintext, in the arena */
} found_t;

#define LABEL_MAX 1024
#define HEAD_MAX 512

typedef struct {
    const unsigned char *b;
    Py_ssize_t p, end;
    const field_t *fields;
    int nfields;
    found_t found[MAX_FOUND];
    int nfound;
    /* opening: envelopes are opened where they are found (every one, or the listed fields') */
    int opening, every;
    unsigned char label[LABEL_MAX]; /* the path so far: "value.a[0]" */
    Py_ssize_t label_len;
    PyObject *heads; /* envelope header (bytes) -> Aead */
    unsigned char last_head[HEAD_MAX]; /* the header looked up last, and its AEAD */
    Py_ssize_t last_hlen;
    Aead *last_aead;
    const unsigned char *prefix, *bound; /* "kanal\0<topic>\0"; 0x00, or 0x01 + the record key */
    Py_ssize_t plen, blen;
    unsigned char *scratch, *arena; /* a decoded envelope; the plaintexts */
    Py_ssize_t used, cap;
} scan_t;

/* What a scan can say: the JSON reads (OK), is not JSON as this scan reads it (UNDECIDED: the
 * Python path decides, and raises when it is not JSON). */
#define OK 0
#define UNDECIDED (-1)

static void skip_space(scan_t *s)
{
    while (s->p < s->end) {
        unsigned char c = s->b[s->p];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            return;
        s->p++;
    }
}

static int hex4(const unsigned char *h, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = h[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* A string from its opening quote: s->p after the closing one. *escaped: whether it has escapes.
 * UTF-8 is checked as strictly as orjson (no overlongs, no surrogates, nothing above U+10FFFF);
 * a \u escape of a surrogate is left UNDECIDED. */
static int scan_string(scan_t *s, int *escaped)
{
    const unsigned char *b = s->b;
    Py_ssize_t p = s->p + 1, end = s->end;
    *escaped = 0;
    while (p < end) {
        /* eight plain ASCII bytes at a time (no quote, backslash, control or non-ASCII byte) */
        while (p + 8 <= end) {
            uint64_t x;
            memcpy(&x, b + p, 8);
            const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
            uint64_t quote = x ^ (ones * '"'), slash = x ^ (ones * '\\');
            uint64_t special = ((quote - ones) & ~quote) | ((slash - ones) & ~slash) | (x - ones * 0x20) | x;
            if (special & highs)
                break;
            p += 8;
        }
        if (p >= end)
            break;
        unsigned char c = b[p];
        if (c == '"') {
            s->p = p + 1;
            return OK;
        }
        if (c == '\\') {
            *escaped = 1;
            if (p + 1 >= end)
                return UNDECIDED;
            unsigned char e = b[p + 1];
            if (e == 'u') {
                unsigned cp;
                if (p + 6 > end || hex4(b + p + 2, &cp) < 0 || (cp >= 0xD800 && cp <= 0xDFFF))
                    return UNDECIDED;
                p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                p += 2;
            } else {
                return UNDECIDED;
            }
        } else if (c < 0x20) {
            return UNDECIDED;
        } else if (c < 0x80) {
            p++;
        } else {
            int n;
            unsigned cp;
            if (c >= 0xC2 && c <= 0xDF) {
                n = 1;
                cp = c & 0x1F;
            } else if (c >= 0xE0 && c <= 0xEF) {
                n = 2;
                cp = c & 0x0F;
            } else if (c >= 0xF0 && c <= 0xF4) {
                n = 3;
                cp = c & 0x07;
            } else {
                return UNDECIDED;
            }
            if (p + n >= end)
                return UNDECIDED;
            for (int i = 1; i <= n; i++) {
                unsigned char k = b[p + i];
                if ((k & 0xC0) != 0x80)
                    return UNDECIDED;
                cp = (cp << 6) | (k & 0x3F);
            }
            if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
                return UNDECIDED;
            p += n + 1;
        }
    }
    return UNDECIDED;
}

#define KEY_BUFFER 256

/* The text of a string's body b[0..n) (checked by scan_string: escapes well formed, no surrogate
 * escapes) in out, UTF-8; its length, or -1 when longer than KEY_BUFFER. */
static Py_ssize_t unescape(const unsigned char *b, Py_ssize_t n, unsigned char *out)
{
    Py_ssize_t o = 0;
    for (Py_ssize_t p = 0; p < n;) {
        if (o + 4 > KEY_BUFFER)
            return -1;
        unsigned char c = b[p];
        if (c != '\\') {
            out[o++] = c;
            p++;
            continue;
        }
        unsigned char e = b[p + 1];
        p += 2;
        switch (e) {
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u': {
            unsigned cp;
            hex4(b + p, &cp);
            p += 4;
            if (cp < 0x80) {
                out[o++] = (unsigned char)cp;
            } else if (cp < 0x800) {
                out[o++] = (unsigned char)(0xC0 | cp >> 6);
                out[o++] = (unsigned char)(0x80 | (cp & 0x3F));
            } else {
                out[o++] = (unsigned char)(0xE0 | cp >> 12);
                out[o++] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                out[o++] = (unsigned char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: out[o++] = e; /* " \ / */
        }
    }
    return o;
}

/* A number: -?(0|[1-9][0-9]*)(\.[0-9]+)?; one with an exponent is left UNDECIDED (orjson refuses
 * those that overflow a double). */
static int scan_number(scan_t *s)
{
    const unsigned char *b = s->b;
    Py_ssize_t p = s->p, end = s->end;
    if (p < end && b[p] == '-')
        p++;
    if (p >= end)
        return UNDECIDED;
    if (b[p] == '0') {
        p++;
    } else if (b[p] >= '1' && b[p] <= '9') {
        while (p < end && b[p] >= '0' && b[p] <= '9')
            p++;
    } else {
        return UNDECIDED;
    }
    if (p < end && b[p] == '.') {
        p++;
        Py_ssize_t digits = p;
        while (p < end && b[p] >= '0' && b[p] <= '9')
            p++;
        if (p == digits)
            return UNDECIDED;
    }
    if (p < end && (b[p] == 'e' || b[p] == 'E' || (b[p] >= '0' && b[p] <= '9')))
        return UNDECIDED;
    s->p = p;
    return OK;
}

static int scan_literal(scan_t *s, const char *word, Py_ssize_t n)
{
    if (s->end - s->p < n || memcmp(s->b + s->p, word, (size_t)n) != 0)
        return UNDECIDED;
    s->p += n;
    return OK;
}

/* The fields (bits of `alive`) whose steps match the path so far, narrowed by one more step at
 * `depth`: a key (key != NULL) or an index. */
static uint64_t narrow(const scan_t *s, uint64_t alive, int depth, const unsigned char *key, Py_ssize_t klen,
                       Py_ssize_t index)
{
    uint64_t next = 0;
    for (int i = 0; alive >> i; i++) {
        if (!((alive >> i) & 1))
            continue;
        const field_t *f = &s->fields[i];
        if (f->nsteps <= depth)
            continue;
        if (key != NULL ? (f->key[depth] != NULL && f->len[depth] == klen && memcmp(f->key[depth], key, (size_t)klen) == 0)
                        : (f->key[depth] == NULL && f->len[depth] == index))
            next |= (uint64_t)1 << i;
    }
    return next;
}

/* ------------------------------------------------------------------------ opening envelopes */

static int scan_value(scan_t *s, uint64_t alive, int depth);

/* Appends ".<key>" to the label (the key as it reads, escapes decoded). */
static int label_step(scan_t *s, const unsigned char *key, Py_ssize_t n, int escaped)
{
    unsigned char plain[KEY_BUFFER];
    if (escaped) {
        n = unescape(key, n, plain);
        if (n < 0)
            return -1;
        key = plain;
    }
    if (s->label_len + 1 + n > LABEL_MAX)
        return -1;
    s->label[s->label_len++] = '.';
    memcpy(s->label + s->label_len, key, (size_t)n);
    s->label_len += n;
    return 0;
}

/* Whether a listed field ends here. */
static int at_field(const scan_t *s, uint64_t alive, int depth)
{
    for (int i = 0; alive >> i; i++)
        if (((alive >> i) & 1) && s->fields[i].nsteps == depth)
            return 1;
    return 0;
}

/* The AEAD of an envelope header: the last one's (a batch mostly shares one), else from `heads`;
 * NULL when it is not at hand. */
static Aead *head_aead(scan_t *s, const unsigned char *head, Py_ssize_t hlen)
{
    if (s->last_aead != NULL && s->last_hlen == hlen && memcmp(s->last_head, head, (size_t)hlen) == 0)
        return s->last_aead;
    PyObject *key = PyBytes_FromStringAndSize((const char *)head, hlen);
    if (key == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *found = PyDict_GetItemWithError(s->heads, key); /* borrowed; `heads` holds it */
    Py_DECREF(key);
    if (found == NULL || !PyObject_TypeCheck(found, &knl_AeadType)) {
        PyErr_Clear();
        return NULL;
    }
    if (hlen <= HEAD_MAX) {
        memcpy(s->last_head, head, (size_t)hlen);
        s->last_hlen = hlen;
        s->last_aead = (Aead *)found;
    }
    return (Aead *)found;
}

/* Opens the text envelope of the string b[start..end) (with its quotes) into the arena: OK, or
 * UNDECIDED for anything but a clean opening (its key not at hand, malformed, not authentic,
 * compressed, not JSON inside), which the Python path then decides and reports. */
static int open_text(scan_t *s, Py_ssize_t start, Py_ssize_t end)
{
    if (s->nfound == MAX_FOUND)
        return UNDECIDED;
    unsigned char *d = s->scratch;
    Py_ssize_t m = knl_base64_decode(s->b + start + 1, end - start - 2, d);
    if (m < 8 || d[3] != 1 || d[5] != 0 || d[4] < 1 || d[4] > 3)
        return UNDECIDED; /* (the magic is what the text prefix decodes to) */
    Py_ssize_t hlen = 8 + ((Py_ssize_t)d[6] << 8 | d[7]);
    if (hlen + 2 > m)
        return UNDECIDED;
    hlen += 2 + ((Py_ssize_t)d[hlen] << 8 | d[hlen + 1]);
    Py_ssize_t size = m - hlen - NONCE_SIZE - TAG_SIZE;
    if (size < 0 || size > INT_MAX || s->used + size > s->cap)
        return UNDECIDED;
    Aead *aead = head_aead(s, d, hlen);
    if (aead == NULL)
        return UNDECIDED;
    EVP_CIPHER_CTX *c = aead->dec;
    unsigned char *out = s->arena + s->used;
    int len;
    if (EVP_DecryptInit_ex(c, NULL, NULL, NULL, d + hlen) != 1
        || EVP_DecryptUpdate(c, NULL, &len, d, (int)hlen) != 1
        || EVP_DecryptUpdate(c, NULL, &len, s->prefix, (int)s->plen) != 1
        || EVP_DecryptUpdate(c, NULL, &len, s->label, (int)s->label_len) != 1
        || EVP_DecryptUpdate(c, NULL, &len, s->bound, (int)s->blen) != 1
        || (size && EVP_DecryptUpdate(c, out, &len, d + hlen + NONCE_SIZE, (int)size) != 1)
        || EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, TAG_SIZE, d + hlen + NONCE_SIZE + size) != 1
        || EVP_DecryptFinal_ex(c, out + size, &len) != 1)
        return UNDECIDED;
    /* the plaintext is a JSON value (as the encrypter sealed it): checked before it is spliced in */
    scan_t inner = {.b = out, .p = 0, .end = size};
    skip_space(&inner);
    if (scan_value(&inner, 0, 0) != OK)
        return UNDECIDED;
    skip_space(&inner);
    if (inner.p != size)
        return UNDECIDED;
    s->found[s->nfound++] = (found_t){start, end, 0, s->used, size};
    s->used += size;
    return OK;
}

/* Past an object's or array's opening: whether it closes right away (`close` consumed). */
static int empty_container(scan_t *s, unsigned char close)
{
    s->p++;
    skip_space(s);
    if (s->p < s->end && s->b[s->p] == close) {
        s->p++;
        return 1;
    }
    return 0;
}

/* A member's or element's value, then what follows it: 1 a comma (another item), 0 `close` (the
 * end, consumed), -1 neither or the value undecided. The label goes back to `label_len`. */
static int scan_item(scan_t *s, uint64_t child, int depth, Py_ssize_t label_len, unsigned char close)
{
    if (scan_value(s, child, depth + 1) != OK)
        return -1;
    s->label_len = label_len;
    skip_space(s);
    if (s->p < s->end && s->b[s->p] == ',') {
        s->p++;
        skip_space(s);
        return 1;
    }
    if (s->p < s->end && s->b[s->p] == close) {
        s->p++;
        return 0;
    }
    return -1;
}

/* A value at s->p (after space) whose path so far is matched by the fields in `alive`, at `depth`. */
static int scan_value(scan_t *s, uint64_t alive, int depth)
{
    if (depth > MAX_DEPTH)
        return UNDECIDED;
    if (s->p >= s->end)
        return UNDECIDED;
    Py_ssize_t start = s->p;
    int rc, escaped;
    unsigned char c = s->b[start];
    if (c == '{') {
        if (!empty_container(s, '}')) {
            for (;;) {
                if (s->p >= s->end || s->b[s->p] != '"')
                    return UNDECIDED;
                Py_ssize_t key = s->p + 1;
                if (scan_string(s, &escaped) != OK)
                    return UNDECIDED;
                uint64_t child = 0;
                Py_ssize_t label_len = s->label_len;
                if (s->opening && label_step(s, s->b + key, s->p - 1 - key, escaped) < 0)
                    return UNDECIDED;
                if (alive && !escaped) {
                    child = narrow(s, alive, depth, s->b + key, s->p - 1 - key, 0);
                } else if (alive) { /* a key spelled with escapes: compared as it reads */
                    unsigned char plain[KEY_BUFFER];
                    Py_ssize_t n = unescape(s->b + key, s->p - 1 - key, plain);
                    if (n < 0)
                        return UNDECIDED;
                    child = narrow(s, alive, depth, plain, n, 0);
                }
                skip_space(s);
                if (s->p >= s->end || s->b[s->p] != ':')
                    return UNDECIDED;
                s->p++;
                skip_space(s);
                int more = scan_item(s, child, depth, label_len, '}');
                if (more < 0)
                    return UNDECIDED;
                if (!more)
                    break;
            }
        }
        rc = OK;
    } else if (c == '[') {
        if (!empty_container(s, ']')) {
            for (Py_ssize_t index = 0;; index++) {
                uint64_t child = alive ? narrow(s, alive, depth, NULL, 0, index) : 0;
                Py_ssize_t label_len = s->label_len;
                if (s->opening) {
                    int n = snprintf((char *)s->label + label_len, (size_t)(LABEL_MAX - label_len), "[%zd]", index);
                    if (n < 0 || n >= LABEL_MAX - label_len)
                        return UNDECIDED;
                    s->label_len += n;
                }
                int more = scan_item(s, child, depth, label_len, ']');
                if (more < 0)
                    return UNDECIDED;
                if (!more)
                    break;
            }
        }
        rc = OK;
    } else if (c == '"') {
        rc = scan_string(s, &escaped);
        int envelope = rc == OK && s->p - start >= 6 && memcmp(s->b + start + 1, "/KNL", 4) == 0;
        if (s->opening) {
            if (envelope && (s->every || at_field(s, alive, depth)))
                return open_text(s, start, s->p);
            return rc;
        }
        /* a string that reads as a text envelope: the policy for encrypted input is Python's */
        if (envelope && alive)
            return UNDECIDED;
    } else if (c == 't') {
        rc = scan_literal(s, "true", 4);
    } else if (c == 'f') {
        rc = scan_literal(s, "false", 5);
    } else if (c == 'n') {
        rc = scan_literal(s, "null", 4);
    } else {
        rc = scan_number(s);
    }
    if (rc != OK)
        return UNDECIDED;
    if (s->opening)
        return OK;
    for (int i = 0; alive >> i; i++) {
        if (((alive >> i) & 1) && s->fields[i].nsteps == depth) {
            if (s->nfound == MAX_FOUND)
                return UNDECIDED;
            s->found[s->nfound++] = (found_t){start, s->p, i, 0, 0};
        }
    }
    return OK;
}

/* The value b[0..n) with its fields sealed; None when it has none; Ellipsis when undecided. */
static PyObject *seal_value(scan_t *s, const unsigned char *b, Py_ssize_t n, const unsigned char *identity,
                            Py_ssize_t ilen)
{
    s->b = b;
    s->p = 0;
    s->end = n;
    s->nfound = 0;
    skip_space(s);
    uint64_t all = ((uint64_t)1 << s->nfields) - 1;
    if (scan_value(s, all, 0) != OK)
        return Py_NewRef(Py_Ellipsis);
    skip_space(s);
    if (s->p != n)
        return Py_NewRef(Py_Ellipsis);
    if (s->nfound == 0)
        Py_RETURN_NONE;
    /* the bound identity: 0x00 without a key, 0x01 + the key */
    unsigned char tag = identity == NULL ? 0 : 1;
    Py_ssize_t size = n, largest = 0;
    for (int i = 0; i < s->nfound; i++) {
        const field_t *f = &s->fields[s->found[i].field];
        Py_ssize_t sealed = ENVELOPE_SIZE(f->hlen, s->found[i].end - s->found[i].start);
        if (sealed > largest)
            largest = sealed;
        size += BASE64_SIZE(sealed) + 2 - (s->found[i].end - s->found[i].start);
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, size);
    unsigned char *sealed = PyMem_Malloc((size_t)largest);
    unsigned char *bound = PyMem_Malloc((size_t)ilen + 1);
    if (result == NULL || sealed == NULL || bound == NULL) {
        Py_XDECREF(result);
        PyMem_Free(sealed);
        PyMem_Free(bound);
        return PyErr_NoMemory();
    }
    bound[0] = tag;
    if (ilen)
        memcpy(bound + 1, identity, (size_t)ilen);
    char *o = PyBytes_AS_STRING(result);
    Py_ssize_t at = 0;
    for (int i = 0; i < s->nfound; i++) {
        const found_t *found = &s->found[i];
        const field_t *f = &s->fields[found->field];
        memcpy(o, b + at, (size_t)(found->start - at));
        o += found->start - at;
        Py_ssize_t len = found->end - found->start;
        if (knl_seal_into(f->aead, f->header, f->hlen, b + found->start, len, f->aad, f->alen, bound, ilen + 1, sealed) < 0) {
            Py_DECREF(result);
            result = NULL;
            break;
        }
        *o++ = '"';
        o += knl_base64_encode(sealed, ENVELOPE_SIZE(f->hlen, len), o);
        *o++ = '"';
        at = found->end;
    }
    if (result != NULL)
        memcpy(o, b + at, (size_t)(n - at));
    PyMem_Free(sealed);
    PyMem_Free(bound);
    return result;
}

/* Reads a field's steps (a non-empty tuple of str or int) into f; the keys' UTF-8 is held in `keep`. */
static int read_steps(PyObject *steps, field_t *f, PyObject *keep)
{
    if (!PyTuple_Check(steps) || PyTuple_GET_SIZE(steps) == 0 || PyTuple_GET_SIZE(steps) > MAX_DEPTH) {
        PyErr_SetString(PyExc_TypeError, "a field's steps: a tuple of 1 to 64 str or int");
        return -1;
    }
    f->nsteps = PyTuple_GET_SIZE(steps);
    f->key = PyMem_Calloc((size_t)f->nsteps, sizeof(char *));
    f->len = PyMem_Calloc((size_t)f->nsteps, sizeof(Py_ssize_t));
    if (f->key == NULL || f->len == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < f->nsteps; k++) {
        PyObject *step = PyTuple_GET_ITEM(steps, k);
        if (PyUnicode_Check(step)) {
            PyObject *utf8 = PyUnicode_AsUTF8String(step);
            if (utf8 == NULL || PyList_Append(keep, utf8) < 0) {
                Py_XDECREF(utf8);
                return -1;
            }
            Py_DECREF(utf8);
            f->key[k] = PyBytes_AS_STRING(utf8);
            f->len[k] = PyBytes_GET_SIZE(utf8);
        } else if (PyLong_Check(step)) {
            f->len[k] = PyLong_AsSsize_t(step);
            if (f->len[k] < 0) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "an index step must not be negative");
                return -1;
            }
        } else {
            PyErr_SetString(PyExc_TypeError, "a step is a str or an int");
            return -1;
        }
    }
    return 0;
}

/* Reads `fields`: a tuple of (steps, aead, header, aad) to seal, or of steps alone (`steps_only`,
 * fields to open). */
static int read_fields(PyObject *fields, field_t *out, int *count, PyObject *keep, int steps_only)
{
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) == 0 || PyTuple_GET_SIZE(fields) > MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "fields: a tuple of 1 to 63 fields");
        return -1;
    }
    *count = (int)PyTuple_GET_SIZE(fields);
    for (int i = 0; i < *count; i++) {
        PyObject *item = PyTuple_GET_ITEM(fields, i);
        if (steps_only) {
            if (read_steps(item, &out[i], keep) < 0)
                return -1;
            continue;
        }
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
            PyErr_SetString(PyExc_ValueError, "a field is (steps, aead, header, aad)");
            return -1;
        }
        PyObject *aead = PyTuple_GET_ITEM(item, 1), *header = PyTuple_GET_ITEM(item, 2);
        PyObject *aad = PyTuple_GET_ITEM(item, 3);
        if (!PyObject_TypeCheck(aead, &knl_AeadType) || !PyBytes_Check(header) || !PyBytes_Check(aad)) {
            PyErr_SetString(PyExc_TypeError, "a field is (steps: tuple, Aead, header: bytes, aad: bytes)");
            return -1;
        }
        field_t *f = &out[i];
        if (read_steps(PyTuple_GET_ITEM(item, 0), f, keep) < 0)
            return -1;
        f->aead = (Aead *)aead;
        f->header = (const unsigned char *)PyBytes_AS_STRING(header);
        f->hlen = PyBytes_GET_SIZE(header);
        f->aad = (const unsigned char *)PyBytes_AS_STRING(aad);
        f->alen = PyBytes_GET_SIZE(aad);
    }
    return 0;
}

/* A span's integer at `i` (values.RecordSpan: key at 6, key end 7, value 8, value end 9). */
static int span_at(PyObject *span, Py_ssize_t i, Py_ssize_t *out)
{
    if (!PyTuple_Check(span) || PyTuple_GET_SIZE(span) <= i) {
        PyErr_SetString(PyExc_TypeError, "a span is a RecordSpan tuple");
        return -1;
    }
    *out = PyLong_AsSsize_t(PyTuple_GET_ITEM(span, i));
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

PyObject *knl_seal_json_fields(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "seal_json_fields(area: bytes, spans: list, fields: tuple)");
        return NULL;
    }
    const unsigned char *area = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    PyObject *spans = args[1];
    field_t fields[MAX_FIELDS];
    memset(fields, 0, sizeof fields);
    scan_t *scan = PyMem_Calloc(1, sizeof(scan_t));
    PyObject *keep = PyList_New(0), *result = NULL;
    int count = 0;
    if (scan == NULL || keep == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (read_fields(args[2], fields, &count, keep, 0) < 0)
        goto done;
    scan->fields = fields;
    scan->nfields = count;
    Py_ssize_t n = PyList_GET_SIZE(spans);
    result = PyList_New(n);
    if (result == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *span = PyList_GET_ITEM(spans, i), *value;
        Py_ssize_t key, key_end, at, end;
        if (span_at(span, 6, &key) < 0 || span_at(span, 7, &key_end) < 0 || span_at(span, 8, &at) < 0
            || span_at(span, 9, &end) < 0) {
            Py_CLEAR(result);
            goto done;
        }
        if ((key >= 0 && (key > key_end || key_end > size)) || (at >= 0 && (at > end || end > size))) {
            PyErr_SetString(PyExc_ValueError, "a span is not within the area");
            Py_CLEAR(result);
            goto done;
        }
        if (at < 0) {
            value = Py_NewRef(Py_None);
        } else {
            value = seal_value(scan, area + at, end - at, key < 0 ? NULL : area + key, key < 0 ? 0 : key_end - key);
            if (value == NULL) {
                Py_CLEAR(result);
                goto done;
            }
        }
        PyList_SET_ITEM(result, i, value);
    }
done:
    for (int i = 0; i < MAX_FIELDS; i++) {
        PyMem_Free((void *)fields[i].key);
        PyMem_Free(fields[i].len);
    }
    Py_XDECREF(keep);
    PyMem_Free(scan);
    return result;
}

/* The zigzag varint at b[*p], read below `limit`; -1 when it does not end there. */
static int read_zigzag(const unsigned char *b, Py_ssize_t limit, Py_ssize_t *p, int64_t *out)
{
    uint64_t raw = 0;
    Py_ssize_t q = *p;
    for (int shift = 0;; shift += 7) {
        if (q >= limit || shift > 63)
            return -1;
        unsigned char x = b[q++];
        raw |= (uint64_t)(x & 0x7F) << shift;
        if (x < 0x80)
            break;
    }
    *p = q;
    *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return 0;
}

/* Whether a record's header section b[p..end) holds a value starting with the envelope magic
 * (or does not read): then the record is the Python path's. */
static int headers_hold_envelopes(const unsigned char *b, Py_ssize_t p, Py_ssize_t end)
{
    int64_t count, n;
    if (read_zigzag(b, end, &p, &count) < 0 || count < 0)
        return 1;
    for (int64_t i = 0; i < count; i++) {
        if (read_zigzag(b, end, &p, &n) < 0 || n < 0 || n > end - p)
            return 1;
        p += n;
        if (read_zigzag(b, end, &p, &n) < 0 || n > end - p)
            return 1;
        if (n >= 3 && memcmp(b + p, "\xfc\xa3\x4b", 3) == 0)
            return 1;
        if (n > 0)
            p += n;
    }
    return 0;
}

/* The value b[0..n) with its envelopes opened; None when it has none; Ellipsis when undecided. */
static PyObject *open_value(scan_t *s, const unsigned char *b, Py_ssize_t n, Py_ssize_t part_len)
{
    static const unsigned char mark[] = "\"/KNL";
    if (memmem(b, (size_t)n, mark, 5) == NULL)
        Py_RETURN_NONE;
    s->b = b;
    s->p = 0;
    s->end = n;
    s->nfound = 0;
    s->used = 0;
    s->label_len = part_len;
    skip_space(s);
    if (scan_value(s, s->every ? 0 : ((uint64_t)1 << s->nfields) - 1, 0) != OK)
        return Py_NewRef(Py_Ellipsis);
    skip_space(s);
    if (s->p != n)
        return Py_NewRef(Py_Ellipsis);
    if (s->nfound == 0)
        Py_RETURN_NONE;
    Py_ssize_t size = n;
    for (int i = 0; i < s->nfound; i++)
        size += s->found[i].clear_len - (s->found[i].end - s->found[i].start);
    PyObject *result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL)
        return NULL;
    char *o = PyBytes_AS_STRING(result);
    Py_ssize_t at = 0;
    for (int i = 0; i < s->nfound; i++) {
        const found_t *f = &s->found[i];
        memcpy(o, b + at, (size_t)(f->start - at));
        o += f->start - at;
        memcpy(o, s->arena + f->clear, (size_t)f->clear_len);
        o += f->clear_len;
        at = f->end;
    }
    memcpy(o, b + at, (size_t)(n - at));
    return result;
}

PyObject *knl_open_json_fields(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 9 || !PyBytes_Check(args[0]) || !PyList_Check(args[1]) || !PyDict_Check(args[3])
        || !PyBytes_Check(args[4]) || !PyBytes_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "open_json_fields(area: bytes, spans: list, start: int, heads: dict, "
                                         "prefix: bytes, part: bytes, fields: tuple | None, keys: bool, headers: bool)");
        return NULL;
    }
    const unsigned char *area = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    PyObject *spans = args[1];
    Py_ssize_t first = PyLong_AsSsize_t(args[2]);
    if (first == -1 && PyErr_Occurred())
        return NULL;
    int keys = PyObject_IsTrue(args[7]), headers = PyObject_IsTrue(args[8]);
    if (keys < 0 || headers < 0)
        return NULL;
    Py_ssize_t part_len = PyBytes_GET_SIZE(args[5]);
    if (part_len >= LABEL_MAX) {
        PyErr_SetString(PyExc_ValueError, "the part's label is too long");
        return NULL;
    }
    field_t fields[MAX_FIELDS];
    memset(fields, 0, sizeof fields);
    scan_t *scan = PyMem_Calloc(1, sizeof(scan_t));
    PyObject *keep = PyList_New(0), *values = NULL, *result = NULL;
    unsigned char *bound = PyMem_Malloc((size_t)size + 1);
    if (scan == NULL || keep == NULL || bound == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    scan->scratch = PyMem_Malloc((size_t)size + 1);
    scan->arena = PyMem_Malloc((size_t)size + 1);
    if (scan->scratch == NULL || scan->arena == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    scan->cap = size;
    scan->opening = 1;
    scan->every = args[6] == Py_None;
    if (!scan->every) {
        if (read_fields(args[6], fields, &scan->nfields, keep, 1) < 0)
            goto done;
        scan->fields = fields;
    }
    scan->heads = args[3];
    scan->prefix = (const unsigned char *)PyBytes_AS_STRING(args[4]);
    scan->plen = PyBytes_GET_SIZE(args[4]);
    memcpy(scan->label, PyBytes_AS_STRING(args[5]), (size_t)part_len);
    scan->bound = bound;
    values = PyList_New(0);
    if (values == NULL)
        goto done;
    Py_ssize_t opened = 0;
    for (Py_ssize_t i = first < 0 ? 0 : first; i < PyList_GET_SIZE(spans); i++) {
        PyObject *span = PyList_GET_ITEM(spans, i), *value;
        Py_ssize_t start, key, key_end, at, end, count;
        if (span_at(span, 0, &start) < 0 || span_at(span, 2, &end) < 0 || span_at(span, 6, &key) < 0
            || span_at(span, 7, &key_end) < 0 || span_at(span, 8, &at) < 0 || span_at(span, 10, &count) < 0)
            goto done;
        Py_ssize_t value_end;
        if (span_at(span, 9, &value_end) < 0)
            goto done;
        if (start < 0 || end > size || (key >= 0 && (key > key_end || key_end > end))
            || (at >= 0 && (at > value_end || value_end > end)) || value_end > end) {
            PyErr_SetString(PyExc_ValueError, "a span is not within the area");
            goto done;
        }
        if ((keys && key >= 0 && key_end - key >= 3 && memcmp(area + key, "\xfc\xa3\x4b", 3) == 0)
            || (headers && count > 0 && headers_hold_envelopes(area, value_end, end)))
            break; /* an encrypted key or header: the Python path */
        if (at < 0) {
            value = Py_NewRef(Py_None);
        } else {
            Py_ssize_t klen = key < 0 ? 0 : key_end - key;
            bound[0] = key < 0 ? 0 : 1;
            if (klen)
                memcpy(bound + 1, area + key, (size_t)klen);
            scan->blen = klen + 1;
            if (value_end - at >= 3 && memcmp(area + at, "\xfc\xa3\x4b", 3) == 0)
                break; /* the whole value is an envelope: the Python path */
            value = open_value(scan, area + at, value_end - at, part_len);
            if (value == NULL)
                goto done;
            if (value == Py_Ellipsis) {
                Py_DECREF(value);
                break;
            }
            if (value != Py_None)
                opened += scan->nfound;
        }
        int failed = PyList_Append(values, value);
        Py_DECREF(value);
        if (failed < 0)
            goto done;
    }
    result = Py_BuildValue("(On)", values, opened);
done:
    for (int i = 0; i < MAX_FIELDS; i++) {
        PyMem_Free((void *)fields[i].key);
        PyMem_Free(fields[i].len);
    }
    if (scan != NULL) {
        PyMem_Free(scan->scratch);
        PyMem_Free(scan->arena);
    }
    PyMem_Free(scan);
    PyMem_Free(bound);
    Py_XDECREF(values);
    Py_XDECREF(keep);
    return result;
}
