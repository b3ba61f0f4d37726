/* What the two files of the encryption plugin's compiled module share: one DEK's AEAD (_aead.c)
 * and the JSON field passes (json_fields.c). */
#ifndef KANAL_ENCRYPTION_AEAD_H
#define KANAL_ENCRYPTION_AEAD_H

#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <string.h>

#define NONCE_SIZE 12
#define TAG_SIZE 16
/* The bytes of an envelope with a `hlen`-byte header and `size` bytes of plaintext. */
#define ENVELOPE_SIZE(hlen, size) ((hlen) + NONCE_SIZE + (size) + TAG_SIZE)
#define BASE64_SIZE(n) (((n) + 2) / 3 * 4)

#define INTERNAL __attribute__((visibility("hidden")))

/* One DEK's AEAD: contexts set up with the key once, and the sealing nonce counter. */
typedef struct {
    PyObject_HEAD
    EVP_CIPHER_CTX *enc;
    EVP_CIPHER_CTX *dec;
    unsigned __int128 next; /* the next nonce, big-endian when written */
    unsigned __int128 start;
    PyObject *error;
} Aead;

INTERNAL extern PyTypeObject knl_AeadType;

/* header + next nonce + AEAD(data, header + aad1 + aad2) in out (ENVELOPE_SIZE bytes); 0, or -1
 * with an exception set. */
INTERNAL int knl_seal_into(Aead *self, const unsigned char *header, Py_ssize_t hlen, const unsigned char *data,
                           Py_ssize_t size, const unsigned char *aad1, Py_ssize_t n1, const unsigned char *aad2,
                           Py_ssize_t n2, unsigned char *out);
/* Standard base64 (padded) of in[0..n) in out (BASE64_SIZE(n) bytes); its length. */
INTERNAL Py_ssize_t knl_base64_encode(const unsigned char *in, Py_ssize_t n, char *out);
/* Strict standard base64 (padded, nothing else) of in[0..n) into out; its length, or -1. */
INTERNAL Py_ssize_t knl_base64_decode(const unsigned char *in, Py_ssize_t n, unsigned char *out);

INTERNAL PyObject *knl_seal_json_fields(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
INTERNAL PyObject *knl_open_json_fields(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
