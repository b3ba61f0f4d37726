/* The encryption plugin's per-record work, compiled (this file: the module and the AEAD;
 * json_fields.c: the JSON field passes).
 *
 * - Aead(algorithm, key, nonce_start, error): one DEK's AES-GCM or ChaCha20-Poly1305 (the ids of
 *   ciphers.Algorithm: 1, 2, 3), OpenSSL's, the key set up once. encrypt/decrypt(nonce, data,
 *   aad) are ciphers.Cipher's callables (decrypt raises `error` when the data does not
 *   authenticate); seal/seal_text(header, plaintext, aad) are envelope.Sealer's, with the nonce
 *   counter kept here (counting up from nonce_start, 12 big-endian bytes).
 * - seal_json_fields(area, spans, fields): for each record span (values.RecordSpan) the value with
 *   the listed JSON fields replaced by the base64 text of their envelopes, None when the record has
 *   none of them (or no value), or Ellipsis when the scan does not decide it (not JSON as it reads
 *   it, a field already an envelope, a surrogate escape or a number with an exponent).
 * - open_json_fields(area, spans, start, heads, prefix, part, fields, keys, headers): from record
 *   `start`, each value with the envelopes of its fields (every one, or the listed) opened with the
 *   AEADs of `heads` (envelope header -> Aead), up to the first record it leaves to the caller (a
 *   key not at hand, an envelope that does not open cleanly, an encrypted key or header); and how
 *   many envelopes it opened.
 *
 * The envelope layout and AAD are envelope.py's; the tests hold these functions to cryptography's
 * AEADs and to the Python passes (encrypt.py, decrypt.py), and fuzz the scan against orjson.
 */
#include "aead.h"

/* ------------------------------------------------------------------------------------ the AEAD */


static const EVP_CIPHER *algorithm_cipher(long id)
{
    switch (id) {
    case 1: return EVP_aes_128_gcm();
    case 2: return EVP_aes_256_gcm();
    case 3: return EVP_chacha20_poly1305();
    default: return NULL;
    }
}

static int Aead_init(Aead *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"algorithm", "key", "nonce_start", "error", NULL};
    long id;
    Py_buffer key;
    const unsigned char *start;
    Py_ssize_t start_len;
    PyObject *error;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ly*y#O", kwlist, &id, &key, &start, &start_len, &error))
        return -1;
    const EVP_CIPHER *cipher = algorithm_cipher(id);
    int rc = -1;
    if (cipher == NULL) {
        PyErr_Format(PyExc_ValueError, "no compiled AEAD for algorithm %ld", id);
        goto done;
    }
    if (key.len != EVP_CIPHER_key_length(cipher)) {
        PyErr_Format(PyExc_ValueError, "algorithm %ld needs a %d-byte key", id, EVP_CIPHER_key_length(cipher));
        goto done;
    }
    if (start_len != NONCE_SIZE) {
        PyErr_SetString(PyExc_ValueError, "the first nonce must have 12 bytes");
        goto done;
    }
    unsigned __int128 first = 0;
    for (int i = 0; i < NONCE_SIZE; i++)
        first = (first << 8) | start[i];
    self->enc = EVP_CIPHER_CTX_new();
    self->dec = EVP_CIPHER_CTX_new();
    if (self->enc == NULL || self->dec == NULL
        || EVP_EncryptInit_ex(self->enc, cipher, NULL, key.buf, NULL) != 1
        || EVP_DecryptInit_ex(self->dec, cipher, NULL, key.buf, NULL) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "the AEAD cannot be set up");
        goto done;
    }
    self->next = self->start = first;
    Py_INCREF(error);
    Py_XSETREF(self->error, error);
    rc = 0;
done:
    PyBuffer_Release(&key);
    return rc;
}

static void Aead_dealloc(Aead *self)
{
    EVP_CIPHER_CTX_free(self->enc);
    EVP_CIPHER_CTX_free(self->dec);
    Py_XDECREF(self->error);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Encrypts data with `nonce` and the associated data aad1 + aad2 + aad3 (any may be empty) into
 * out: the ciphertext, then the tag. 0, or -1 with an exception set. */
static int encrypt_into(Aead *self, const unsigned char *nonce, const unsigned char *data, Py_ssize_t size,
                        const unsigned char *aad1, Py_ssize_t n1, const unsigned char *aad2, Py_ssize_t n2,
                        const unsigned char *aad3, Py_ssize_t n3, unsigned char *out)
{
    EVP_CIPHER_CTX *c = self->enc;
    int len;
    if (size > INT_MAX || n1 > INT_MAX || n2 > INT_MAX || n3 > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "too large to encrypt in one call");
        return -1;
    }
    if (EVP_EncryptInit_ex(c, NULL, NULL, NULL, nonce) != 1
        || (n1 && EVP_EncryptUpdate(c, NULL, &len, aad1, (int)n1) != 1)
        || (n2 && EVP_EncryptUpdate(c, NULL, &len, aad2, (int)n2) != 1)
        || (n3 && EVP_EncryptUpdate(c, NULL, &len, aad3, (int)n3) != 1)
        || (size && EVP_EncryptUpdate(c, out, &len, data, (int)size) != 1)
        || EVP_EncryptFinal_ex(c, out + size, &len) != 1
        || EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, TAG_SIZE, out + size) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "the AEAD failed to encrypt");
        return -1;
    }
    return 0;
}

/* The next nonce of the counter, big-endian, in out[0..11]. */
static void next_nonce(Aead *self, unsigned char *out)
{
    unsigned __int128 n = self->next++;
    for (int i = NONCE_SIZE - 1; i >= 0; i--) {
        out[i] = (unsigned char)n;
        n >>= 8;
    }
}

/* The three bytes-like arguments of encrypt, decrypt, seal and seal_text (`usage` names them);
 * -1 with an exception set, else the caller releases all three. */
static int three_buffers(PyObject *const *args, Py_ssize_t nargs, const char *usage, Py_buffer *a, Py_buffer *b,
                         Py_buffer *c)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "expected %s", usage);
        return -1;
    }
    if (PyObject_GetBuffer(args[0], a, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(args[1], b, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(a);
        return -1;
    }
    if (PyObject_GetBuffer(args[2], c, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(a);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static void release_three(Py_buffer *a, Py_buffer *b, Py_buffer *c)
{
    PyBuffer_Release(a);
    PyBuffer_Release(b);
    PyBuffer_Release(c);
}

static PyObject *Aead_encrypt(Aead *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer nonce, data, aad;
    if (three_buffers(args, nargs, "encrypt(nonce, data, aad)", &nonce, &data, &aad) < 0)
        return NULL;
    PyObject *result = NULL;
    if (nonce.len != NONCE_SIZE) {
        PyErr_SetString(PyExc_ValueError, "the nonce must have 12 bytes");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, data.len + TAG_SIZE);
    if (result != NULL
        && encrypt_into(self, nonce.buf, data.buf, data.len, aad.buf, aad.len, NULL, 0, NULL, 0,
                        (unsigned char *)PyBytes_AS_STRING(result)) < 0)
        Py_CLEAR(result);
done:
    release_three(&nonce, &data, &aad);
    return result;
}

static PyObject *Aead_decrypt(Aead *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer nonce, data, aad;
    if (three_buffers(args, nargs, "decrypt(nonce, data, aad)", &nonce, &data, &aad) < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t size = data.len - TAG_SIZE;
    if (nonce.len != NONCE_SIZE || size < 0 || size > INT_MAX || aad.len > INT_MAX) {
        PyErr_SetString(self->error, "the data is shorter than a tag, or the nonce has the wrong size");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL)
        goto done;
    EVP_CIPHER_CTX *c = self->dec;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    unsigned char tag[TAG_SIZE];
    memcpy(tag, (const unsigned char *)data.buf + size, TAG_SIZE);
    int len;
    if (EVP_DecryptInit_ex(c, NULL, NULL, NULL, nonce.buf) != 1
        || (aad.len && EVP_DecryptUpdate(c, NULL, &len, aad.buf, (int)aad.len) != 1)
        || (size && EVP_DecryptUpdate(c, out, &len, data.buf, (int)size) != 1)
        || EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, TAG_SIZE, tag) != 1
        || EVP_DecryptFinal_ex(c, out + size, &len) != 1) {
        Py_CLEAR(result);
        PyErr_SetString(self->error, "the data does not authenticate");
    }
done:
    release_three(&nonce, &data, &aad);
    return result;
}

int knl_seal_into(Aead *self, const unsigned char *header, Py_ssize_t hlen, const unsigned char *data,
                     Py_ssize_t size, const unsigned char *aad1, Py_ssize_t n1, const unsigned char *aad2,
                     Py_ssize_t n2, unsigned char *out)
{
    memcpy(out, header, (size_t)hlen);
    next_nonce(self, out + hlen);
    return encrypt_into(self, out + hlen, data, size, header, hlen, aad1, n1, aad2, n2, out + hlen + NONCE_SIZE);
}


static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
/* Two base64 characters per 12 bits (filled at import): half the lookups of one per 6 bits. */
static uint16_t B64_PAIRS[4096];

static void base64_init(void)
{
    for (int i = 0; i < 4096; i++) {
        unsigned char pair[2] = {(unsigned char)B64[i >> 6], (unsigned char)B64[i & 63]};
        memcpy(&B64_PAIRS[i], pair, 2);
    }
}

Py_ssize_t knl_base64_encode(const unsigned char *in, Py_ssize_t n, char *out)
{
    char *o = out;
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        memcpy(o, &B64_PAIRS[v >> 12], 2);
        memcpy(o + 2, &B64_PAIRS[v & 4095], 2);
        o += 4;
    }
    if (i < n) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
        o[0] = B64[v >> 18];
        o[1] = B64[(v >> 12) & 63];
        o[2] = i + 1 < n ? B64[(v >> 6) & 63] : '=';
        o[3] = '=';
        o += 4;
    }
    return o - out;
}

static PyObject *Aead_seal(Aead *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer header, data, aad;
    if (three_buffers(args, nargs, "(header, plaintext, aad)", &header, &data, &aad) < 0)
        return NULL;
    PyObject *result = PyBytes_FromStringAndSize(NULL, ENVELOPE_SIZE(header.len, data.len));
    if (result != NULL
        && knl_seal_into(self, header.buf, header.len, data.buf, data.len, aad.buf, aad.len, NULL, 0,
                     (unsigned char *)PyBytes_AS_STRING(result)) < 0)
        Py_CLEAR(result);
    release_three(&header, &data, &aad);
    return result;
}

static PyObject *Aead_seal_text(Aead *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer header, data, aad;
    if (three_buffers(args, nargs, "(header, plaintext, aad)", &header, &data, &aad) < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t size = ENVELOPE_SIZE(header.len, data.len);
    unsigned char *sealed = PyMem_Malloc((size_t)size);
    if (sealed == NULL) {
        PyErr_NoMemory();
    } else if (knl_seal_into(self, header.buf, header.len, data.buf, data.len, aad.buf, aad.len, NULL, 0, sealed) == 0) {
        result = PyUnicode_New(BASE64_SIZE(size), 127);
        if (result != NULL)
            knl_base64_encode(sealed, size, (char *)PyUnicode_DATA(result));
    }
    PyMem_Free(sealed);
    release_three(&header, &data, &aad);
    return result;
}

static PyObject *Aead_count(Aead *self, void *closure)
{
    (void)closure;
    unsigned __int128 n = self->next - self->start;
    return PyLong_FromUnsignedLongLong((unsigned long long)n);
}

static PyMethodDef Aead_methods[] = {
    {"encrypt", (PyCFunction)(void (*)(void))Aead_encrypt, METH_FASTCALL,
     "encrypt(nonce, data, aad): the ciphertext and its tag."},
    {"decrypt", (PyCFunction)(void (*)(void))Aead_decrypt, METH_FASTCALL,
     "decrypt(nonce, data, aad): the plaintext; raises the error type when it does not authenticate."},
    {"seal", (PyCFunction)(void (*)(void))Aead_seal, METH_FASTCALL,
     "seal(header, plaintext, aad): header + next nonce + AEAD(plaintext, header + aad)."},
    {"seal_text", (PyCFunction)(void (*)(void))Aead_seal_text, METH_FASTCALL,
     "seal_text(header, plaintext, aad): seal(...) as base64 text."},
    {NULL},
};

static PyGetSetDef Aead_getset[] = {
    {"count", (getter)Aead_count, NULL, "seals done so far", NULL},
    {NULL},
};

PyTypeObject knl_AeadType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kanal_encryption.crypto._aead.Aead",
    .tp_basicsize = sizeof(Aead),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One DEK's AEAD (OpenSSL), its key schedule built once.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Aead_init,
    .tp_dealloc = (destructor)Aead_dealloc,
    .tp_methods = Aead_methods,
    .tp_getset = Aead_getset,
};

static signed char B64_VALUES[256];

static void base64_decode_init(void)
{
    memset(B64_VALUES, -1, sizeof B64_VALUES);
    for (int i = 0; i < 64; i++)
        B64_VALUES[(unsigned char)B64[i]] = (signed char)i;
}

Py_ssize_t knl_base64_decode(const unsigned char *in, Py_ssize_t n, unsigned char *out)
{
    if (n == 0 || n % 4)
        return -1;
    Py_ssize_t pad = in[n - 1] == '=' ? (in[n - 2] == '=' ? 2 : 1) : 0;
    unsigned char *o = out;
    for (Py_ssize_t i = 0; i < n; i += 4) {
        int last = i + 4 == n;
        int a = B64_VALUES[in[i]], b = B64_VALUES[in[i + 1]];
        int c = last && pad == 2 ? 0 : B64_VALUES[in[i + 2]];
        int d = last && pad ? 0 : B64_VALUES[in[i + 3]];
        if ((a | b | c | d) < 0)
            return -1;
        uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
        *o++ = (unsigned char)(v >> 16);
        if (!(last && pad == 2))
            *o++ = (unsigned char)(v >> 8);
        if (!(last && pad))
            *o++ = (unsigned char)v;
    }
    return o - out;
}

static PyMethodDef module_methods[] = {
    {"seal_json_fields", (PyCFunction)(void (*)(void))knl_seal_json_fields, METH_FASTCALL,
     "seal_json_fields(area, spans, fields): each record's value with its JSON fields sealed."},
    {"open_json_fields", (PyCFunction)(void (*)(void))knl_open_json_fields, METH_FASTCALL,
     "open_json_fields(area, spans, start, heads, prefix, part, fields, keys, headers): from record `start`, "
     "each value with its JSON fields' envelopes opened, up to the first record it leaves to the caller; "
     "and how many it opened."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kanal_encryption.crypto._aead",
    .m_doc = "The encryption plugin's compiled per-record work.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__aead(void)
{
    if (PyType_Ready(&knl_AeadType) < 0)
        return NULL;
    base64_init();
    base64_decode_init();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Aead", (PyObject *)&knl_AeadType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
