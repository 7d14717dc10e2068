/* The compiled speed-up of aioproducer: the per-record work of producing, in C.
 *
 * Optional. _py.py is the pure-Python implementation of exactly this interface and is what
 * runs when this module cannot be built (or AIOPRODUCER_PURE_PYTHON=1); the test suite checks
 * that both produce the same bytes and partitions. Keep the two in step.
 *
 *   RecordWriter(base_timestamp, limit)   records of one RecordBatch v2, encoded on append,
 *                                         and the batch's header
 *   MemoryPool(available)                 buffer_memory, which writers grow from
 *   AccumulatorFields                     the accumulator's state that opening a batch
 *                                         touches, and the opening (open_new, _open)
 *   murmur2(data) -> int                  Kafka's Utils.murmur2, signed 32-bit
 *   partition_for_key(key, n) -> int      toPositive(murmur2(key)) % n
 *   append_many(...)                      enqueue_many's loop: partition, append, remember
 *   Columns(count, keys, values)          enqueue_many's records as Arrow-layout columns,
 *                                         which append_many reads where they lie
 *   append_record(...) -> future | None   enqueue()'s and send()'s append and record future
 *   watch_batches(batches, bulk) -> int   an enqueue_many future registered with its batches
 *   RecordFields                          a record future's fields, and the Future protocol
 *                                         asyncio calls on it (done, result, callbacks...)
 *   run_callbacks(report, records)        run records' done callbacks
 *   encode_produce(...) -> bytes | list | None   a whole Produce request frame (large
 *                                         batches by reference: a list of its parts)
 *   decode_produce(...) -> dict | None    a Produce response body
 *
 * The last two take only the common case (None: the generated codec in protocol/messages.py,
 * which is their pure-Python twin, does it), and are checked against that codec.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define BATCH_HEADER_SIZE 61  /* the layout: protocol/batch_layout.py */
#define TRANSACTIONAL_BIT 0x10  /* of a batch's attributes (batch_layout.TRANSACTIONAL) */

/* -- murmur2 ------------------------------------------------------------------------------ */

static int32_t
murmur2_hash(const unsigned char *data, Py_ssize_t length)
{
    const uint32_t m = 0x5bd1e995;
    uint32_t h = 0x9747b28c ^ (uint32_t)length;
    Py_ssize_t end = length & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < end; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 |
                     (uint32_t)data[i + 2] << 16 | (uint32_t)data[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3: h ^= (uint32_t)data[end + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t)data[end + 1] << 8;  /* fall through */
    case 1: h ^= (uint32_t)data[end]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

static Py_ssize_t
partition_of(const unsigned char *key, Py_ssize_t length, Py_ssize_t partitions)
{
    return (Py_ssize_t)((uint32_t)murmur2_hash(key, length) & 0x7fffffff) % partitions;
}

static PyObject *
py_murmur2(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int32_t h = murmur2_hash(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong(h);
}

/* PyLong_AsLongLong without its general path, which 3.11 takes for any int of more than one
   30-bit digit (a timestamp in ms, an offset): ~200 instructions through
   _PyLong_AsByteArray, a tenth of an enqueue(). The same value and the same errors. */
static inline long long
as_long_long(PyObject *number)
{
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(number, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "int too big to convert");
        return -1;
    }
    return value;
}

/* METH_FASTCALL's argument count: 0 and a TypeError naming the arguments if it is wrong. */
static inline int
takes_args(Py_ssize_t nargs, Py_ssize_t expected, const char *usage)
{
    if (nargs == expected)
        return 1;
    PyErr_SetString(PyExc_TypeError, usage);
    return 0;
}

static PyObject *
py_partition_for_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 2, "partition_for_key(key, num_partitions)"))
        return NULL;
    Py_ssize_t partitions = PyLong_AsSsize_t(args[1]);
    if (partitions == -1 && PyErr_Occurred())
        return NULL;
    if (partitions <= 0) {
        PyErr_SetString(PyExc_ValueError, "num_partitions must be positive");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t p = partition_of(view.buf, view.len, partitions);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(p);
}

/* -- varints ------------------------------------------------------------------------------ */

static inline uint64_t
zigzag(int64_t n)
{
    return ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
}

static inline int
uvarint_size(uint64_t n)
{
    int size = 1;
    while (n >= 0x80) {
        n >>= 7;
        size++;
    }
    return size;
}

static inline char *
put_uvarint(char *out, uint64_t n)
{
    while (n >= 0x80) {
        *out++ = (char)((n & 0x7f) | 0x80);
        n >>= 7;
    }
    *out++ = (char)n;
    return out;
}

static inline int
varint_size(int64_t n)
{
    return uvarint_size(zigzag(n));
}

static inline char *
put_varint(char *out, int64_t n)
{
    return put_uvarint(out, zigzag(n));
}

static inline char *
put_be(char *out, uint64_t n, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--)
        out[i] = (char)(n >> (8 * (bytes - 1 - i)));
    return out + bytes;
}

/* -- MemoryPool --------------------------------------------------------------------------- */

/* The accumulator's buffer_memory: the bytes no batch holds. A writer given one (draw_from)
 * raises its own limit from it when a record does not fit, so that the compiled loops need
 * not stop for Python at every doubling of a batch's reservation (issue 42: at 10,000
 * partitions those stops and the new batches' were half of enqueue_many's CPU). While
 * records wait in line for memory (`paused`), no batch grows: they are served first. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t available;
    char paused;
} MemoryPool;

static int
pool_init(MemoryPool *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"available", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n", names, &self->available))
        return -1;
    self->paused = 0;
    return 0;
}

static PyMemberDef pool_members[] = {
    {"available", T_PYSSIZET, offsetof(MemoryPool, available), 0,
     "bytes of buffer_memory no batch holds"},
    {"paused", T_BOOL, offsetof(MemoryPool, paused), 0,
     "records wait in line for memory: no batch grows meanwhile"},
    {NULL}
};

static PyTypeObject MemoryPoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioproducer._speedups._c.MemoryPool",
    .tp_doc = "MemoryPool(available): the memory batches draw on as they grow.",
    .tp_basicsize = sizeof(MemoryPool),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pool_init,
    .tp_members = pool_members,
};

/* -- RecordWriter ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    char *buffer;
    Py_ssize_t length;    /* bytes of encoded records */
    Py_ssize_t capacity;
    long long base_timestamp;
    long long max_timestamp;
    Py_ssize_t count;
    Py_ssize_t size;      /* the batch on the wire, uncompressed, header included */
    Py_ssize_t limit;
    int sealed;
    MemoryPool *pool;     /* what its limit grows from (draw_from), or NULL */
    Py_ssize_t reserved;  /* bytes it holds of the pool (may exceed limit: a large first record) */
    Py_ssize_t most;      /* how far its limit may grow (batch_size) */
    /* What goes on the wire once sealed (its SealedRecords, or bytes compressed; for the
       pure-Python twin and by hand, any bytes-like: never anything that could lead back here, so the writer stays out of the
       garbage collector's way, as at many partitions there is one a record), and its codec;
       set by BatchWriter.close(). */
    PyObject *payload;
    int codec;
} RecordWriter;

static PyTypeObject RecordWriterType;

static int
writer_init(RecordWriter *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"base_timestamp", "limit", NULL};
    long long base_timestamp;
    Py_ssize_t limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Ln", names, &base_timestamp, &limit))
        return -1;
    PyMem_Free(self->buffer);
    self->buffer = NULL;
    self->length = self->capacity = 0;
    self->base_timestamp = self->max_timestamp = base_timestamp;
    self->count = 0;
    self->size = BATCH_HEADER_SIZE;
    self->limit = limit;
    self->sealed = 0;
    Py_CLEAR(self->payload);
    self->codec = 0;
    return 0;
}

/* Every class made in Python is a garbage-collected type; a subclass that adds no field
   (BatchWriter) holds nothing that could lead back to its instances, which are kept out of
   the collector's way (at many partitions there is a writer a record, all kept by the record
   futures users hold). */
static PyObject *
writer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *self = type->tp_alloc(type, 0);
    if (self != NULL && PyObject_IS_GC(self) && type->tp_basicsize == sizeof(RecordWriter) &&
        type->tp_dictoffset == 0)
        PyObject_GC_UnTrack(self);
    return self;
}

static void
writer_dealloc(RecordWriter *self)
{
    PyMem_Free(self->buffer);
    Py_XDECREF(self->pool);
    Py_XDECREF(self->payload);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Raise the limit so that a batch of `need` bytes fits, drawing the memory from the pool:
 * to twice the limit (at most `most`), or, if that much is not free, to `need`. 0, drawing
 * nothing, without a pool, while records wait in line for memory, past `most`, or when the
 * memory is not free (the caller then closes the batch: it is sent, and frees its memory). */
static int
writer_grow(RecordWriter *self, Py_ssize_t need)
{
    MemoryPool *pool = self->pool;
    if (pool == NULL || pool->paused || need > self->most)
        return 0;
    Py_ssize_t limit = self->limit > self->most - self->limit ? self->most : 2 * self->limit;
    if (limit < need)
        limit = need;
    if (limit - self->reserved > pool->available) {
        limit = need;
        if (limit - self->reserved > pool->available)
            return 0;
    }
    if (limit > self->reserved) {
        pool->available -= limit - self->reserved;
        self->reserved = limit;
    }
    self->limit = limit;
    return 1;
}

/* Append one record; 1 if appended, 0 if the batch is full or sealed, -1 on error. The key
 * and value are NULL for a null key or value. */
static int
writer_append(RecordWriter *self, long long timestamp,
              const char *key, Py_ssize_t key_length,
              const char *value, Py_ssize_t value_length,
              const char *headers, Py_ssize_t headers_length)
{
    if (self->sealed)
        return 0;
    /* Unsigned, so that out-of-range values wrap (as Java's long arithmetic does) instead
     * of overflowing a signed int64 (undefined behaviour). */
    int64_t delta = (int64_t)((uint64_t)timestamp - (uint64_t)self->base_timestamp);
    Py_ssize_t body = 1 + varint_size(delta) + varint_size(self->count)
        + (key ? varint_size(key_length) + key_length : 1)
        + (value ? varint_size(value_length) + value_length : 1)
        + (headers ? headers_length : 1);
    Py_ssize_t total = varint_size(body) + body;
    if (self->size + total > self->limit && self->count > 0 &&
        !writer_grow(self, self->size + total))
        return 0;
    if (self->length + total > self->capacity) {
        Py_ssize_t capacity = self->capacity ? self->capacity : 256;
        Py_ssize_t most = self->limit - BATCH_HEADER_SIZE;  /* the memory reserved for it */
        while (capacity < self->length + total)
            capacity *= 2;
        if (most < self->length + total)
            most = self->length + total;  /* (a first record larger than the limit) */
        if (capacity > most)
            capacity = most;  /* no more than buffer_memory counts for the batch */
        char *grown = PyMem_Realloc(self->buffer, capacity);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->buffer = grown;
        self->capacity = capacity;
    }
    char *out = put_varint(self->buffer + self->length, body);
    *out++ = 0;  /* record attributes */
    out = put_varint(out, delta);
    out = put_varint(out, self->count);
    if (key) {
        out = put_varint(out, key_length);
        memcpy(out, key, key_length);
        out += key_length;
    } else {
        *out++ = 1;  /* varint -1 */
    }
    if (value) {
        out = put_varint(out, value_length);
        memcpy(out, value, value_length);
        out += value_length;
    } else {
        *out++ = 1;
    }
    if (headers) {
        memcpy(out, headers, headers_length);
        out += headers_length;
    } else {
        *out++ = 0;  /* no headers */
    }
    self->length += total;
    self->size += total;
    self->count++;
    if (timestamp > self->max_timestamp)
        self->max_timestamp = timestamp;
    return 1;
}

/* A view of an optional bytes-like argument; data is NULL for None. */
typedef struct {
    Py_buffer view;
    const char *data;
    Py_ssize_t length;
    int held;
} OptionalBytes;

static int
optional_bytes(PyObject *obj, OptionalBytes *out)
{
    out->held = 0;
    if (obj == Py_None) {
        out->data = NULL;
        out->length = 0;
    } else if (PyBytes_CheckExact(obj)) {
        out->data = PyBytes_AS_STRING(obj);
        out->length = PyBytes_GET_SIZE(obj);
    } else {
        if (PyObject_GetBuffer(obj, &out->view, PyBUF_SIMPLE) < 0)
            return -1;
        out->held = 1;
        out->data = out->view.buf ? out->view.buf : "";  /* empty, not null */
        out->length = out->view.len;
    }
    return 0;
}

static void
release_optional(OptionalBytes *b)
{
    if (b->held)
        PyBuffer_Release(&b->view);
}

static PyObject *
writer_try_append(RecordWriter *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 4, "try_append(timestamp, key, value, headers)"))
        return NULL;
    long long timestamp = as_long_long(args[0]);
    if (timestamp == -1 && PyErr_Occurred())
        return NULL;
    OptionalBytes key, value, headers;
    if (optional_bytes(args[1], &key) < 0)
        return NULL;
    if (optional_bytes(args[2], &value) < 0) {
        release_optional(&key);
        return NULL;
    }
    if (optional_bytes(args[3], &headers) < 0) {
        release_optional(&key);
        release_optional(&value);
        return NULL;
    }
    int appended = writer_append(self, timestamp, key.data, key.length, value.data,
                                 value.length, headers.data, headers.length);
    release_optional(&key);
    release_optional(&value);
    release_optional(&headers);
    if (appended < 0)
        return NULL;
    return PyBool_FromLong(appended);
}

/* A batch's sealed records: the writer's buffer, handed over at seal() without a copy and
 * read through the buffer protocol (compress() reads it, header() checksums it, and the
 * Produce request writes it as it is, see encode_produce); bytes-like to Python (len(), ==).
 * Not a memoryview of it: a memoryview and its managed buffer are two objects the garbage
 * collector tracks, kept until the batch is acknowledged, and at many partitions there is a
 * batch every record or two; this one holds nothing and is never tracked. Freed when the
 * last reference to it goes (a view of it holds one). */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t length;
} SealedRecords;

static int
sealed_getbuffer(SealedRecords *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data ? self->data : "",
                             self->length, 1, flags);
}

static void
sealed_dealloc(SealedRecords *self)
{
    PyMem_Free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
sealed_length(SealedRecords *self)
{
    return self->length;
}

/* Equal to any bytes-like object of the same bytes, as a memoryview of them was. */
static PyObject *
sealed_richcompare(SealedRecords *self, PyObject *other, int op)
{
    Py_buffer view;
    if ((op != Py_EQ && op != Py_NE) || PyObject_GetBuffer(other, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    int same = view.len == self->length &&
        (self->length == 0 || memcmp(view.buf, self->data, self->length) == 0);
    PyBuffer_Release(&view);
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static PyBufferProcs sealed_as_buffer = {(getbufferproc)sealed_getbuffer, NULL};
static PySequenceMethods sealed_as_sequence = {.sq_length = (lenfunc)sealed_length};

static PyTypeObject SealedRecordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioproducer._speedups._c.SealedRecords",
    .tp_doc = "A batch's sealed records: bytes-like (the buffer protocol, len(), ==).",
    .tp_basicsize = sizeof(SealedRecords),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)sealed_dealloc,
    .tp_as_buffer = &sealed_as_buffer,
    .tp_as_sequence = &sealed_as_sequence,
    .tp_richcompare = (richcmpfunc)sealed_richcompare,
};

static PyObject *
writer_seal(RecordWriter *self, PyObject *unused)
{
    SealedRecords *sealed = PyObject_New(SealedRecords, &SealedRecordsType);
    if (sealed == NULL)
        return NULL;
    sealed->data = self->buffer;
    sealed->length = self->length;
    self->sealed = 1;
    self->buffer = NULL;
    self->length = self->capacity = 0;  /* sealed again (an expired retry): empty */
    return (PyObject *)sealed;
}

static PyObject *
writer_draw_from(RecordWriter *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 2, "draw_from(pool, most)"))
        return NULL;
    if (!PyObject_TypeCheck(args[0], &MemoryPoolType)) {
        PyErr_SetString(PyExc_TypeError, "draw_from takes a MemoryPool");
        return NULL;
    }
    Py_ssize_t most = PyLong_AsSsize_t(args[1]);
    if (most == -1 && PyErr_Occurred())
        return NULL;
    Py_XSETREF(self->pool, (MemoryPool *)Py_NewRef(args[0]));
    self->most = most;
    Py_RETURN_NONE;
}

static PyObject *crc32c_function;  /* crc32c.crc32c of the dependency: hardware CRC-32C */

/* CRC-32C (Castagnoli, reflected) of a few bytes, by table: a batch header's 40 bytes, which
 * cost a memoryview and a call of crc32c.crc32c each (per batch: at many partitions a batch
 * may hold one record); the payload's CRC goes on from it in crc32c's hardware path. */
static uint32_t crc32c_table[256];

static void
crc32c_table_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc32c_table[n] = c;
    }
}

static uint32_t
crc32c_small(const char *data, Py_ssize_t length)
{
    uint32_t crc = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < length; i++)
        crc = crc32c_table[(crc ^ (unsigned char)data[i]) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

/* crc32c.crc32c(data, value) */
static PyObject *
crc32c_of(PyObject *data, PyObject *value)
{
    PyObject *args[2] = {data, value};
    return PyObject_Vectorcall(crc32c_function, args, 2, NULL);
}

/* The batch's header for `payload` (its sealed records, any bytes-like), 61 bytes. */
static PyObject *
batch_header(RecordWriter *self, PyObject *payload, long long attributes,
             long long producer_id, long long epoch, long long base_sequence)
{
    Py_buffer view;
    if (PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t length = view.len;
    PyBuffer_Release(&view);
    if (length > INT32_MAX - BATCH_HEADER_SIZE) {
        PyErr_SetString(PyExc_OverflowError, "the batch is too large");
        return NULL;
    }
    PyObject *header = PyBytes_FromStringAndSize(NULL, BATCH_HEADER_SIZE);
    if (header == NULL)
        return NULL;
    char *out = PyBytes_AS_STRING(header);
    put_be(out, 0, 8);                                            /* base offset */
    put_be(out + 8, BATCH_HEADER_SIZE - 12 + length, 4);          /* batch length */
    put_be(out + 12, (uint64_t)-1, 4);                            /* leader epoch */
    out[16] = 2;                                                  /* magic */
    put_be(out + 21, (uint64_t)attributes, 2);
    put_be(out + 23, (uint64_t)(self->count - 1), 4);             /* last offset delta */
    put_be(out + 27, (uint64_t)self->base_timestamp, 8);
    put_be(out + 35, (uint64_t)self->max_timestamp, 8);
    put_be(out + 43, (uint64_t)producer_id, 8);
    put_be(out + 51, (uint64_t)epoch, 2);
    put_be(out + 53, (uint64_t)base_sequence, 4);
    put_be(out + 57, (uint64_t)self->count, 4);
    /* The CRC covers attributes to the end of the payload: the header's part, then the
     * payload where it lies (no copy of it next to the header). */
    PyObject *crc = PyLong_FromUnsignedLong(crc32c_small(out + 21, BATCH_HEADER_SIZE - 21));
    PyObject *whole = crc ? crc32c_of(payload, crc) : NULL;
    Py_XDECREF(crc);
    unsigned long checksum = whole ? PyLong_AsUnsignedLong(whole) : (unsigned long)-1;
    Py_XDECREF(whole);
    if (PyErr_Occurred()) {
        Py_DECREF(header);
        return NULL;
    }
    put_be(out + 17, checksum, 4);
    return header;
}

static PyObject *
writer_header(RecordWriter *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 5, "header(payload, attributes, producer_id, "
                    "producer_epoch, base_sequence)"))
        return NULL;
    static const struct { long long low, high; const char *name; } fields[4] = {
        {-32768, 32767, "attributes"}, {INT64_MIN, INT64_MAX, "producer_id"},
        {-32768, 32767, "producer_epoch"}, {INT32_MIN, INT32_MAX, "base_sequence"},
    };
    long long value[4];
    for (int i = 0; i < 4; i++) {
        value[i] = as_long_long(args[i + 1]);
        if (value[i] == -1 && PyErr_Occurred())
            return NULL;
        if (value[i] < fields[i].low || value[i] > fields[i].high) {
            PyErr_Format(PyExc_OverflowError, "%s is out of range", fields[i].name);
            return NULL;
        }
    }
    return batch_header(self, args[0], value[0], value[1], value[2], value[3]);
}

static PyMethodDef writer_methods[] = {
    {"try_append", (PyCFunction)(void (*)(void))writer_try_append, METH_FASTCALL,
     "try_append(timestamp, key, value, headers) -> bool\n\n"
     "Append a record unless it would take the batch past its limit (the first record\n"
     "always fits). `headers` is the encoded header section, or None for no headers."},
    {"draw_from", (PyCFunction)(void (*)(void))writer_draw_from, METH_FASTCALL,
     "draw_from(pool, most)\n\n"
     "Let try_append raise the limit, up to `most`, with memory drawn from `pool` (a\n"
     "MemoryPool) when a record does not fit; `reserved` counts what the writer holds."},
    {"seal", (PyCFunction)writer_seal, METH_NOARGS,
     "seal() -> bytes-like: no more appends; the encoded records (not copied)."},
    {"header", (PyCFunction)(void (*)(void))writer_header, METH_FASTCALL,
     "header(payload, attributes, producer_id, producer_epoch, base_sequence) -> bytes\n\n"
     "The 61-byte RecordBatch v2 header that goes before `payload` on the wire (count and\n"
     "timestamps from this writer, the CRC-32C of both), `payload` being the sealed records\n"
     "as sent (compressed or not)."},
    {NULL}
};

static PyMemberDef writer_members[] = {
    {"count", T_PYSSIZET, offsetof(RecordWriter, count), READONLY, "records appended"},
    {"size", T_PYSSIZET, offsetof(RecordWriter, size), READONLY,
     "the batch's uncompressed size on the wire"},
    {"base_timestamp", T_LONGLONG, offsetof(RecordWriter, base_timestamp), READONLY, NULL},
    {"max_timestamp", T_LONGLONG, offsetof(RecordWriter, max_timestamp), READONLY, NULL},
    {"limit", T_PYSSIZET, offsetof(RecordWriter, limit), 0,
     "the size past which try_append refuses a record (raised as the batch's memory grows)"},
    {"reserved", T_PYSSIZET, offsetof(RecordWriter, reserved), 0,
     "bytes of buffer memory the batch holds"},
    {"payload", T_OBJECT, offsetof(RecordWriter, payload), 0,
     "the sealed records as sent (bytes-like: seal()'s, or compressed), or None"},
    {"codec", T_INT, offsetof(RecordWriter, codec), 0, "the payload's compression codec"},
    {NULL}
};

static PyTypeObject RecordWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioproducer._speedups._c.RecordWriter",
    .tp_doc = "Records of one RecordBatch v2, encoded as they are appended.",
    .tp_basicsize = sizeof(RecordWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = writer_new,
    .tp_init = (initproc)writer_init,
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_methods = writer_methods,
    .tp_members = writer_members,
};

/* -- BatchFields: a ProducerBatch's fields ---------------------------------------------------- */

/* A RecordFuture's fields (RecordFields, below). `older`: the future of the record made
   before it in the same batch, while the batch keeps them (its `newest`), else NULL. It
   comes first, beside the object's reference count, read with it as a chain is let go: the
   object (96 bytes with the collector's header) spans two cache lines. `watched`: its batch
   has it among its `watched` (set by batch_add_watcher, cleared as its callbacks are taken
   to run), so a record given callbacks again after they were removed is held once. */
typedef struct {
    PyObject_HEAD
    PyObject *older, *batch;
    Py_ssize_t watched;  /* (a flag, in the slot of a pointer: the fields' offsets stay) */
    PyObject *callback, *context, *more_callbacks, *offset_delta, *timestamp;
} RecordFields;

static PyTypeObject RecordFieldsType;

/* A batch's fields, set in one C call: at 10,000 partitions a batch may hold one record (a
   producer that yields to the loop often), and ProducerBatch's Python __init__, 22 fields,
   was a tenth of a batch's cost. Its methods stay Python (batch.py); the members are
   object slots, which the record futures read by offset as they read a slotted class's. */

/* The fields every record reads (its future's questions, an append, gather's watch) come
   first, with the object's header: at many partitions each record goes to another batch, out
   of the CPU's caches, and fields spread over the whole object were a cache miss more. So
   do `acked_base` and `acked_time`, which are no members: the base_offset and
   log_append_time its future was given by complete() if it was acknowledged whole (not
   split), else NOT_ACKED. A record's future answers from them once set, reading nothing
   of its batch but its header, these, its topic and its partition (one cache line, mostly),
   without asking the batch's asyncio future nor reading the ints it holds (objects out of
   the caches too: gather asks each record cancelled(), exception() and result() once all
   are done, in the order the records were made). Nor is `loop`: its asyncio future's loop,
   set when the accumulator opens it (else NULL: the future is asked), which a record's
   future answers get_loop() with (gather asks it of every record before watching it), again
   without reading the asyncio future. The fields are in the order they are read: gather's
   answers and an append (newest: beside the reference count an append raises), then the
   answers' acked_base, acked_time, topic and partition, gather's watch (loop, watched and
   its count), and `pieces` (a split batch's answers).

   `newest` is the newest of its records' futures (each holds the one made before it:
   RecordFields' `older`), NULL while it has none, None once it lets them go (done): a chain
   where a list was, so that an append writes only the batch's line and the new future's
   (the list's header and its array were two lines more, cold at many partitions).
   Python reads it as `_untracked`, a list. `watched` is an array of the records watched
   (gather's: those with done callbacks), in the order they were watched, `watched_count` of
   them held, room for `watched_room` (NULL and 0 until the first; ints, so that the
   object stays in its size class, 224 bytes with the collector's header, and its fields
   where they were: moved 16 bytes on, gather's first touches of a batch (get_loop,
   cancelled) counted ~1.5 cache misses a record more): Python reads it as
   `_watchers`, a list, or None. Not a chain through the records, as `newest` is: at 10,000
   partitions the batch's completion walked each chain, a load that waited for the one
   before (the futures are cold by then), ~9% of gather's CPU; an array's records are read
   independently, and run_callbacks fetches them ahead. An append is a store to the array
   (count and pointer on the batch's line), no load of its line. */
typedef struct {
    PyObject_HEAD
    PyObject *newest;
    long long acked_base, acked_time;
    PyObject *topic, *partition, *loop;
    PyObject **watched;
    int watched_count, watched_room;
    PyObject *pieces, *writer, *future, *done, *number, *created, *deadline, *attempts,
        *retry_at, *base_sequence, *producer_id, *producer_epoch, *full, *bulks, *parent,
        *first_delta;
} BatchFields;

#define BATCH_FIELD_COUNT 16  /* the PyObject pointers above, in order from `pieces` */
#define NOT_ACKED LLONG_MIN  /* a batch's acked_base until it is acknowledged whole */

static PyObject *zero_float;  /* 0.0, every new batch's retry_at */

static inline PyObject **
batch_fields(BatchFields *self)
{
    return &self->pieces;
}

/* Whether `obj` is a BatchFields (PyObject_TypeCheck's answer), asked a dozen times a
   record (appends, and each of gather's questions to a record's future), where
   ProducerBatch, a subclass, made each a walk of its MRO: the subclass last found is
   remembered (held: no other class can come to have its address). */
static PyTypeObject BatchFieldsType;
static PyObject *batch_subclass;

static inline int
is_batch(PyObject *obj)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type == &BatchFieldsType || (PyObject *)type == batch_subclass)
        return 1;
    if (!PyType_IsSubtype(type, &BatchFieldsType))
        return 0;
    Py_XSETREF(batch_subclass, Py_NewRef((PyObject *)type));
    return 1;
}

/* A batch of `type` (BatchFields or a subclass) with these fields, the rest at their
   starting values; `reserved` goes to the writer, which counts the memory the batch holds. */
static PyObject *
batch_fields_make(PyTypeObject *type, PyObject *number, PyObject *topic, PyObject *partition,
                  PyObject *writer, PyObject *future, PyObject *created, PyObject *deadline,
                  PyObject *reserved)
{
    /* Bytes of buffer_memory the batch holds: its writer's to count (it grows them). */
    if (PyObject_TypeCheck(writer, &RecordWriterType)) {
        Py_ssize_t held = PyLong_AsSsize_t(reserved);
        if (held == -1 && PyErr_Occurred())
            return NULL;
        ((RecordWriter *)writer)->reserved = held;
    }
    else if (PyObject_SetAttrString(writer, "reserved", reserved) < 0)
        return NULL;
    BatchFields *self = (BatchFields *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->acked_base = NOT_ACKED;
    PyObject *minus_one = PyLong_FromLong(-1), *zero = PyLong_FromLong(0);  /* (cached) */
    self->number = Py_NewRef(number);
    self->topic = Py_NewRef(topic);
    self->partition = Py_NewRef(partition);
    self->writer = Py_NewRef(writer);
    self->future = Py_NewRef(future);
    self->created = Py_NewRef(created);
    self->deadline = Py_NewRef(deadline);
    self->attempts = Py_NewRef(zero);
    self->retry_at = Py_NewRef(zero_float);
    self->base_sequence = Py_NewRef(minus_one);
    self->producer_id = Py_NewRef(minus_one);
    self->producer_epoch = Py_NewRef(minus_one);
    self->done = Py_NewRef(Py_False);
    self->full = Py_NewRef(Py_False);
    self->bulks = Py_NewRef(Py_None);
    self->pieces = Py_NewRef(Py_None);
    self->parent = Py_NewRef(Py_None);
    self->first_delta = Py_NewRef(zero);
    Py_DECREF(minus_one);
    Py_DECREF(zero);
    return (PyObject *)self;
}

static PyObject *
batch_fields_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *number, *topic, *partition, *writer, *future, *created, *deadline, *reserved;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "ProducerBatch takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "ProducerBatch", 8, 8, &number, &topic, &partition, &writer,
                           &future, &created, &deadline, &reserved))
        return NULL;
    return batch_fields_make(type, number, topic, partition, writer, future, created, deadline,
                             reserved);
}

static int
batch_fields_traverse(BatchFields *self, visitproc visit, void *arg)
{
    Py_VISIT(self->newest);
    Py_VISIT(self->topic);
    Py_VISIT(self->partition);
    Py_VISIT(self->loop);
    for (int i = 0; i < self->watched_count; i++)
        Py_VISIT(self->watched[i]);
    PyObject **fields = batch_fields(self);
    for (int i = 0; i < BATCH_FIELD_COUNT; i++)
        Py_VISIT(fields[i]);
    return 0;
}

/* Lets go of the records watched (clearing their mark: they are no longer), the array with
   them. */
static void
batch_drop_watched(BatchFields *self)
{
    PyObject **watched = self->watched;
    int count = self->watched_count;
    self->watched = NULL;
    self->watched_count = self->watched_room = 0;
    for (int i = 0; i < count; i++) {
        ((RecordFields *)watched[i])->watched = 0;
        Py_DECREF(watched[i]);
    }
    PyMem_Free(watched);
}

static int
batch_fields_clear(BatchFields *self)
{
    Py_CLEAR(self->newest);
    Py_CLEAR(self->topic);
    Py_CLEAR(self->partition);
    Py_CLEAR(self->loop);
    batch_drop_watched(self);
    PyObject **fields = batch_fields(self);
    for (int i = 0; i < BATCH_FIELD_COUNT; i++)
        Py_CLEAR(fields[i]);
    return 0;
}

static void
batch_fields_dealloc(BatchFields *self)
{
    PyObject_GC_UnTrack(self);
    batch_fields_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* An acknowledged batch (not split, nor a piece) leads to nothing that leads back to it:
   its records' waits and callbacks are let go as they run, and what watches it later holds
   it only until a loop callback runs. At many partitions a batch may hold one record, and
   the batches that the record futures users keep hold were most of the collector's work.
   So does its asyncio future (asyncio's C Future) once it holds its result, two ints: its
   callbacks are handed to the loop when it is resolved, and what it keeps is its loop, which
   leads back to it only through a callback the loop has yet to run (a closed loop runs or
   drops them all). Tracked, it was the one object per acknowledged batch left for every
   full collection to walk (10,000 partitions, a producer yielding to the loop every 100
   records: a third of the CPU went to the collector). */
static PyObject *s_result;  /* (interned at import, with the others below) */

/* Whether the collector may leave a batch of this type alone: one that adds no __dict__ (a
   subclass's attributes could lead anywhere). */
static inline int
batch_may_untrack(PyObject *self)
{
    return Py_TYPE(self)->tp_dictoffset == 0;
}

static inline int
is_asyncio_future(PyObject *obj)
{
    return obj != NULL && strcmp(Py_TYPE(obj)->tp_name, "_asyncio.Future") == 0;
}

static PyObject *
batch_fields_untrack(PyObject *self, PyObject *unused)
{
    if (!batch_may_untrack(self))
        Py_RETURN_NONE;
    if (PyObject_GC_IsTracked(self))
        PyObject_GC_UnTrack(self);
    PyObject *future = ((BatchFields *)self)->future;
    if (!is_asyncio_future(future))
        Py_RETURN_NONE;
    PyObject *outcome = PyObject_CallMethodNoArgs(future, s_result);
    if (outcome == NULL)  /* not resolved with a result: left as it is */
        PyErr_Clear();
    else if (PyTuple_CheckExact(outcome) && PyTuple_GET_SIZE(outcome) == 2 &&
             PyLong_CheckExact(PyTuple_GET_ITEM(outcome, 0)) &&
             PyLong_CheckExact(PyTuple_GET_ITEM(outcome, 1))) {
        if (PyObject_GC_IsTracked(outcome))
            PyObject_GC_UnTrack(outcome);
        if (PyObject_GC_IsTracked(future))
            PyObject_GC_UnTrack(future);
        Py_DECREF(outcome);
        Py_RETURN_NONE;
    }
    Py_XDECREF(outcome);
    if (!PyObject_GC_IsTracked(future))  /* (opened untracked: see below) */
        PyObject_GC_Track(future);
    Py_RETURN_NONE;
}

/* A batch the accumulator opens starts out of the collector's way too, with its asyncio
   future, until it is done: pending, it is held by the accumulator (its queue, the batches
   incomplete), and what it holds leads back to it only through its record futures, which
   are untracked themselves, or through what a failure, a split or an enqueue_many call
   brings, and a failure or a split hands it back to the collector (_track). Tracked, a
   pending batch and its future outlived two young collections and were promoted to the
   oldest generation, whose growth sets when the next full collection comes: with a batch
   every record or two (many partitions) that was several full collections a run, each
   walking every object the process holds (40-60 ms with 200k record futures kept). */
static void
batch_fields_pending_untrack(PyObject *self)
{
    if (!batch_may_untrack(self))
        return;
    if (PyObject_GC_IsTracked(self))
        PyObject_GC_UnTrack(self);
    PyObject *future = ((BatchFields *)self)->future;
    if (is_asyncio_future(future) && PyObject_GC_IsTracked(future))
        PyObject_GC_UnTrack(future);
}

static PyObject *
batch_fields_track(PyObject *self, PyObject *unused)
{
    if (!PyObject_GC_IsTracked(self))
        PyObject_GC_Track(self);
    PyObject *future = ((BatchFields *)self)->future;
    if (future != NULL && PyObject_IS_GC(future) && !PyObject_GC_IsTracked(future))
        PyObject_GC_Track(future);
    PyObject *bulks = ((BatchFields *)self)->bulks;  /* (see py_watch_batches) */
    if (bulks != NULL && PyList_CheckExact(bulks) && !PyObject_GC_IsTracked(bulks))
        PyObject_GC_Track(bulks);
    Py_RETURN_NONE;
}

/* The batch lets its records' futures go (done): it drops the newest, and the chain goes
   with it once the user has dropped that one too (its dealloc undoes the chain from there:
   see let_go_chain). Not undone here link by link: a walk down the chain is a load that
   waits for the one before, a cache miss each at complete() (the futures are cold by then),
   where the list it replaced let the CPU overlap them (flushed at 6 partitions: 1.2x the
   CPU of the list's). Each future lets go of the one before it as its callbacks run or
   its result is asked (let_go_older); one never awaited nor asked keeps its batch's older
   futures until it is dropped (a batch's worth at most). */
static void
batch_let_go_records(BatchFields *self)
{
    Py_XSETREF(self->newest, Py_NewRef(Py_None));
}

/* `_untracked`: its records' futures, oldest first, in a new list; None once it let them go
   (a record's future made then is tracked from the start). */
static PyObject *
batch_fields_get_untracked(BatchFields *self, void *unused)
{
    if (self->newest == Py_None)
        Py_RETURN_NONE;
    PyObject *records = PyList_New(0);
    if (records == NULL)
        return NULL;
    for (PyObject *node = self->newest; node != NULL; node = ((RecordFields *)node)->older) {
        if (PyList_Append(records, node) < 0) {
            Py_DECREF(records);
            return NULL;
        }
    }
    if (PyList_Reverse(records) < 0) {
        Py_DECREF(records);
        return NULL;
    }
    return records;
}

static int
batch_fields_set_untracked(BatchFields *self, PyObject *value, void *unused)
{
    if (value != Py_None) {
        PyErr_SetString(PyExc_TypeError,
                        "a batch's _untracked can only be let go (set to None)");
        return -1;
    }
    batch_let_go_records(self);
    return 0;
}

/* The records watched, in the order they were watched, in a new list: `take`, the batch
   hands them over (their references, without reading them: run_callbacks clears their
   mark as it runs them); else None if there are none. */
static PyObject *
batch_watchers_list(BatchFields *self, int take)
{
    Py_ssize_t count = self->watched_count;
    if (count == 0 && !take)
        Py_RETURN_NONE;
    PyObject *records = PyList_New(count);
    if (records == NULL)
        return NULL;
    PyObject **items = ((PyListObject *)records)->ob_item;
    if (count)
        memcpy(items, self->watched, count * sizeof(PyObject *));
    if (!take) {
        for (Py_ssize_t i = 0; i < count; i++)
            Py_INCREF(items[i]);
        return records;
    }
    PyMem_Free(self->watched);
    self->watched = NULL;
    self->watched_count = self->watched_room = 0;
    return records;
}

static PyObject *
batch_fields_get_watchers(BatchFields *self, void *unused)
{
    return batch_watchers_list(self, 0);
}

static PyObject *
batch_fields_take_watchers(BatchFields *self, PyObject *unused)
{
    return batch_watchers_list(self, 1);
}

/* Adds `record` to the records watched (0), unless it is watched already (1: a record
   given callbacks again after they were removed; its callbacks run once either way); -1
   with MemoryError. The array doubles as it fills (a batch of 10,000 partitions' gather
   holds ~20). */
static int
batch_add_watcher(BatchFields *self, RecordFields *record)
{
    if (record->watched)
        return 1;
    if (self->watched_count == self->watched_room) {
        int room = self->watched_room ? 2 * self->watched_room : 8;
        PyObject **watched = PyMem_Resize(self->watched, PyObject *, room);
        if (watched == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->watched = watched;
        self->watched_room = room;
    }
    self->watched[self->watched_count++] = Py_NewRef((PyObject *)record);
    record->watched = 1;
    return 0;
}

/* A batch's outcome is in: run its records' callbacks in one loop callback (the batch's
   _run_watchers), and count it down in the enqueue_many futures with records in it. */
static PyObject *s_done, *s_get_loop, *s_set_result, *s_call_soon, *s_run_watchers,
    *s_piece_done, *s_pending, *s_resolve, *s_free;  /* (interned at import) */

static int
batch_wake_watchers(BatchFields *self, PyObject *woken)
{
    if (self->future == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the batch has no future");
        return -1;
    }
    if (self->watched_count && woken != NULL) {
        if (PyList_Append(woken, (PyObject *)self) < 0)  /* (its caller runs them) */
            return -1;
    }
    else if (self->watched_count) {
        PyObject *loop = PyObject_CallMethodNoArgs(self->future, s_get_loop);
        if (loop == NULL)
            return -1;
        PyObject *run = PyObject_GetAttr((PyObject *)self, s_run_watchers);
        PyObject *handle = run == NULL ? NULL : PyObject_CallMethodOneArg(loop, s_call_soon, run);
        Py_XDECREF(run);
        Py_DECREF(loop);
        if (handle == NULL)
            return -1;
        Py_DECREF(handle);
    }
    PyObject *bulks = self->bulks;
    self->bulks = Py_NewRef(Py_None);
    if (bulks == NULL || bulks == Py_None) {
        Py_XDECREF(bulks);
        return 0;
    }
    if (!PyList_Check(bulks)) {
        Py_DECREF(bulks);
        PyErr_SetString(PyExc_TypeError, "a batch's _bulks is a list");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(bulks); i++) {
        PyObject *bulk = Py_NewRef(PyList_GET_ITEM(bulks, i));
        PyObject *pending = PyObject_GetAttr(bulk, s_pending);
        Py_ssize_t left = pending == NULL ? -1 : PyLong_AsSsize_t(pending) - 1;
        Py_XDECREF(pending);
        PyObject *count = PyErr_Occurred() ? NULL : PyLong_FromSsize_t(left);
        int failed = count == NULL || PyObject_SetAttr(bulk, s_pending, count) < 0;
        Py_XDECREF(count);
        if (!failed && left == 0) {
            PyObject *done = PyObject_CallMethodNoArgs(bulk, s_done);
            int is_done = done == NULL ? -1 : PyObject_IsTrue(done);
            Py_XDECREF(done);
            PyObject *resolved = is_done == 0 ? PyObject_CallMethodNoArgs(bulk, s_resolve) : NULL;
            failed = is_done < 0 || (is_done == 0 && resolved == NULL);
            Py_XDECREF(resolved);
        }
        Py_DECREF(bulk);
        if (failed) {
            Py_DECREF(bulks);
            return -1;
        }
    }
    Py_DECREF(bulks);
    return 0;
}

/* watch(record): see _py.BatchFields.watch. */
static PyObject *
batch_fields_watch(BatchFields *self, PyObject *record)
{
    if (!PyObject_TypeCheck(record, &RecordFieldsType)) {
        PyErr_SetString(PyExc_TypeError, "watch() takes a record's future");
        return NULL;
    }
    if (self->watched_count) {
        if (batch_add_watcher(self, (RecordFields *)record) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (self->future == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the batch has no future");
        return NULL;
    }
    int added = batch_add_watcher(self, (RecordFields *)record);
    if (added < 0)
        return NULL;
    if (added)
        Py_RETURN_NONE;
    PyObject *done = PyObject_CallMethodNoArgs(self->future, s_done);
    int is_done = done == NULL ? -1 : PyObject_IsTrue(done);
    Py_XDECREF(done);
    if (is_done < 0)
        return NULL;
    if (is_done) {
        PyObject *loop = PyObject_CallMethodNoArgs(self->future, s_get_loop);
        PyObject *run = loop == NULL ? NULL : PyObject_GetAttr((PyObject *)self, s_run_watchers);
        PyObject *handle = run == NULL ? NULL : PyObject_CallMethodOneArg(loop, s_call_soon, run);
        Py_XDECREF(run);
        Py_XDECREF(loop);
        if (handle == NULL)
            return NULL;
        Py_DECREF(handle);
    }
    Py_RETURN_NONE;
}

static PyObject *
batch_fields_wake_watchers(BatchFields *self, PyObject *unused)
{
    if (batch_wake_watchers(self, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* complete(base_offset, log_append_time[, woken]): see _py.BatchFields.complete. One call per
   batch a response acknowledges, where ProducerBatch.complete was five Python frames (at
   10,000 partitions a batch may hold one record). 0, or -1 with an error set. */
static int
batch_complete(BatchFields *self, PyObject *base_offset, PyObject *log_append_time,
               PyObject *woken)
{
    if (self->future == NULL || self->writer == NULL || self->parent == NULL ||
        self->pieces == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the batch's fields are not set");
        return -1;
    }
    Py_XSETREF(self->done, Py_NewRef(Py_True));
    batch_let_go_records(self);
    PyObject *writer = self->writer;
    if (PyObject_TypeCheck(writer, &RecordWriterType))
        Py_CLEAR(((RecordWriter *)writer)->payload);  /* (BatchWriter.free()) */
    else {
        PyObject *freed = PyObject_CallMethodNoArgs(writer, s_free);
        if (freed == NULL)
            return -1;
        Py_DECREF(freed);
    }
    PyObject *future = Py_NewRef(self->future);
    PyObject *done = PyObject_CallMethodNoArgs(future, s_done);
    int acked = done == NULL ? -1 : !PyObject_IsTrue(done);
    Py_XDECREF(done);
    if (acked > 0) {  /* (else it failed already: expired in flight) */
        PyObject *outcome = PyTuple_Pack(2, base_offset, log_append_time);
        PyObject *set = outcome == NULL ? NULL
            : PyObject_CallMethodOneArg(future, s_set_result, outcome);
        if (set == NULL)
            acked = -1;
        else if (self->pieces == Py_None && PyLong_CheckExact(base_offset) &&
                 PyLong_CheckExact(log_append_time)) {  /* (for its records' futures) */
            long long base = as_long_long(base_offset), time = as_long_long(log_append_time);
            if (PyErr_Occurred())  /* (out of range: they ask its future) */
                PyErr_Clear();
            else {
                self->acked_time = time;
                self->acked_base = base;
            }
        }
        Py_XDECREF(outcome);
        Py_XDECREF(set);
    }
    Py_DECREF(future);
    if (acked < 0 || batch_wake_watchers(self, woken) < 0)
        return -1;
    if (self->parent != Py_None) {
        PyObject *parent = Py_NewRef(self->parent);
        PyObject *told = PyObject_CallMethodNoArgs(parent, s_piece_done);
        Py_DECREF(parent);
        if (told == NULL)
            return -1;
        Py_DECREF(told);
    }
    else if (acked && self->pieces == Py_None) {
        /* Nothing of it leads back to it now: out of the garbage collector's way (users
           keep the record futures, which hold their batches). */
        PyObject *untracked = batch_fields_untrack((PyObject *)self, NULL);
        if (untracked == NULL)
            return -1;
        Py_DECREF(untracked);
    }
    return 0;
}

static PyObject *
batch_fields_complete(BatchFields *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "complete(base_offset, log_append_time, woken=None)");
        return NULL;
    }
    PyObject *woken = nargs == 3 && args[2] != Py_None ? args[2] : NULL;
    if (woken != NULL && !PyList_Check(woken)) {
        PyErr_SetString(PyExc_TypeError, "complete()'s woken is a list");
        return NULL;
    }
    if (batch_complete(self, args[0], args[1], woken) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef batch_fields_methods[] = {
    {"_untrack", (PyCFunction)batch_fields_untrack, METH_NOARGS,
     "_untrack(): out of the garbage collector's way (an acknowledged batch)."},
    {"_track", (PyCFunction)batch_fields_track, METH_NOARGS,
     "_track(): back in the garbage collector's way, with its asyncio future (a batch that\n"
     "fails or is split: see _speedups/_c.c)."},
    {"complete", (PyCFunction)(void (*)(void))batch_fields_complete, METH_FASTCALL,
     "complete(base_offset, log_append_time, woken=None): acknowledged (unless it failed\n"
     "already); its records' callbacks run soon (given a list `woken`, the batch is added to\n"
     "it instead: its caller runs them), its enqueue_many futures count it, a piece tells\n"
     "its batch, and a whole batch leaves the garbage collector's way."},
    {"watch", (PyCFunction)batch_fields_watch, METH_O,
     "watch(record): run `record`'s done callbacks once this batch is done, or soon if it\n"
     "is: either way in one loop callback for all the records watched meanwhile."},
    {"_take_watchers", (PyCFunction)batch_fields_take_watchers, METH_NOARGS,
     "_take_watchers(): the records watched, in the order they were watched (a list), which\n"
     "are no longer."},
    {"_wake_watchers", (PyCFunction)batch_fields_wake_watchers, METH_NOARGS,
     "_wake_watchers(): the batch is done: run its records' callbacks soon, and count it\n"
     "down in its enqueue_many futures."},
    {NULL}
};

#define BATCH_MEMBER(name, field, doc) \
    {name, T_OBJECT_EX, offsetof(BatchFields, field), 0, doc}

static PyMemberDef batch_fields_members[] = {
    BATCH_MEMBER("number", number, "creation order (a piece's: its batch's, then its index)"),
    BATCH_MEMBER("topic", topic, NULL),
    BATCH_MEMBER("partition", partition, NULL),
    BATCH_MEMBER("writer", writer, "its records (a BatchWriter)"),
    BATCH_MEMBER("future", future, "the batch's asyncio future"),
    BATCH_MEMBER("created", created, "loop time of its creation"),
    BATCH_MEMBER("deadline", deadline, "delivery_timeout_ms after creation"),
    BATCH_MEMBER("attempts", attempts, NULL),
    BATCH_MEMBER("retry_at", retry_at, NULL),
    BATCH_MEMBER("base_sequence", base_sequence, NULL),
    BATCH_MEMBER("producer_id", producer_id, NULL),
    BATCH_MEMBER("producer_epoch", producer_epoch, NULL),
    BATCH_MEMBER("done", done, NULL),
    BATCH_MEMBER("full", full, "a record did not fit: closed for appends, sendable now"),
    BATCH_MEMBER("_bulks", bulks, "enqueue_many futures with records here"),
    BATCH_MEMBER("pieces", pieces, "what it was split into, in order"),
    BATCH_MEMBER("parent", parent, "the batch this is a piece of"),
    BATCH_MEMBER("first_delta", first_delta, "offset delta of a piece's first record"),
    {NULL}
};

static PyGetSetDef batch_fields_getset[] = {
    {"_untracked", (getter)batch_fields_get_untracked, (setter)batch_fields_set_untracked,
     "its records' futures, out of the collector's way (None once it let them go)", NULL},
    {"_watchers", (getter)batch_fields_get_watchers, NULL,
     "records' futures with callbacks, in the order they were watched (None: none)", NULL},
    {NULL}
};

static PyTypeObject BatchFieldsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioproducer._speedups._c.BatchFields",
    .tp_doc = "BatchFields(number, topic, partition, writer, future, created, deadline,\n"
              "            reserved)\n\n"
              "A ProducerBatch's fields, the rest at their starting values; `reserved` goes\n"
              "to the writer, which counts the memory the batch holds.",
    .tp_basicsize = sizeof(BatchFields),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = batch_fields_new,
    .tp_dealloc = (destructor)batch_fields_dealloc,
    .tp_traverse = (traverseproc)batch_fields_traverse,
    .tp_clear = (inquiry)batch_fields_clear,
    .tp_members = batch_fields_members,
    .tp_getset = batch_fields_getset,
    .tp_methods = batch_fields_methods,
};

/* -- RecordFuture: its fields and the Future protocol asyncio calls on it ------------------- */

/* A RecordFuture per record is what a caller of enqueue() holds, often hundreds of thousands
   of them: tracked by the garbage collector, each full collection walks them all (a third of
   the CPU of gather over 500k records). While it follows a batch that has not failed, a
   record's future is in no reference cycle that outlives the batch: the waits, callbacks and
   the batch's chain of its untracked futures (BatchFields' `newest`), which point back at
   it, are dropped when the batch is done (the chain's links lead only to older futures),
   and an acknowledged batch leads to no frame or user object. So a future of a BatchFields
   not done (or of another class with a list `_untracked`: in that list) starts untracked,
   in its chain; the batch hands them all to the collector (_track) if it fails (the
   exception's traceback may come to hold frames that hold them). A future of anything
   else (a record waiting in line for memory) is
   tracked from the start, and so is one cancelled. (A producer abandoned unclosed, its loop
   gone, leaves its pending batches and their futures to the end of the process.)

   asyncio.gather calls seven methods on every record's future (get_loop, add_done_callback,
   then cancelled and exception twice, and result): as Python methods they were a fifth of
   enqueue + gather's CPU, so the part of the protocol asyncio calls is here, in C. Each asks
   the record's batch (or what stands in for it: a WaitingRecord, a _Decided) as the Python
   methods of _py.RecordFields do: its asyncio future, its `pieces` (a split batch answers for
   each record), its topic and partition. */

static PyObject *s_untracked, *s_future, *s_pieces, *s_topic, *s_partition,
    *s_metadata_type, *s_metadata, *s_exception_for, *s_watch, *s_done,
    *s_cancelled, *s_get_loop, *s_result, *s_exception, *s_context;  /* interned at import */

/* The batch attributes a record's future reads (asyncio.gather makes it read a dozen per
   record), from the batch's slots where its class has them (ProducerBatch: __slots__), as
   the member descriptors PyObject_GetAttr would find return them; else, or when a slot is
   empty, by PyObject_GetAttr. The offsets are learnt per class and version tag (a class
   changed since has another tag; a class without one is always asked). */
enum { A_FUTURE, A_PIECES, A_TOPIC, A_PARTITION, A_UNTRACKED, A_COUNT };
static PyObject **batch_names[A_COUNT] = {&s_future, &s_pieces, &s_topic, &s_partition,
                                          &s_untracked};
static struct {
    PyTypeObject *type;  /* compared only, never followed */
    unsigned int version;
    Py_ssize_t offset[A_COUNT];  /* -1: ask PyObject_GetAttr */
} batch_slots;

/* The offset of `name`'s slot in `type`'s instances (a member descriptor, as __slots__
   make), or -1: an attribute found another way (PyObject_GetAttr's to answer). */
static Py_ssize_t
slot_offset(PyTypeObject *type, PyObject *name)
{
    PyObject *found = type->tp_getattro == PyObject_GenericGetAttr
        ? _PyType_Lookup(type, name) : NULL;  /* (borrowed) */
    PyMemberDef *member = found != NULL && Py_IS_TYPE(found, &PyMemberDescr_Type)
        ? ((PyMemberDescrObject *)found)->d_member : NULL;
    return member != NULL && member->type == T_OBJECT_EX && !(member->flags & READ_RESTRICTED)
        ? member->offset : -1;
}

/* `type`'s version tag, 0 if it has none (then it is always asked). */
static unsigned int
version_of(PyTypeObject *type)
{
#ifdef Py_TPFLAGS_VALID_VERSION_TAG
    return type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG ? type->tp_version_tag : 0;
#else
    return type->tp_version_tag;  /* (0: none) */
#endif
}

static void
learn_slots(PyTypeObject *type)
{
    batch_slots.type = type;
    for (int i = 0; i < A_COUNT; i++)
        batch_slots.offset[i] = slot_offset(type, *batch_names[i]);
    batch_slots.version = version_of(type);
}

/* batch.<name of `which`>, a new reference (NULL and the error as PyObject_GetAttr). */
static PyObject *
batch_attr(PyObject *batch, int which)
{
    PyTypeObject *type = Py_TYPE(batch);
    if (type != batch_slots.type || type->tp_version_tag != batch_slots.version)
        learn_slots(type);
    Py_ssize_t offset = batch_slots.offset[which];
    if (batch_slots.version != 0 && offset >= 0) {
        PyObject *value = *(PyObject **)((char *)batch + offset);
        if (value != NULL)
            return Py_NewRef(value);
    }
    return PyObject_GetAttr(batch, *batch_names[which]);
}

/* One attribute read where its class keeps it in a slot, as batch_attr reads a batch's:
   the Appender reads five a record (the lifecycle's state, thread and loop_running, the
   cluster's topics, the topic's leaders), and PyObject_GetAttr was ~190 instructions each,
   a fifth of an enqueue(). */
typedef struct {
    PyTypeObject *type;  /* compared only, never followed */
    unsigned int version;
    Py_ssize_t offset;  /* -1: ask PyObject_GetAttr */
} SlotCache;

/* obj.<name>, a new reference (NULL and the error as PyObject_GetAttr). */
static PyObject *
read_slot(SlotCache *cache, PyObject *obj, PyObject *name)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type != cache->type || type->tp_version_tag != cache->version) {
        cache->offset = slot_offset(type, name);
        cache->type = type;
        cache->version = version_of(type);
    }
    if (cache->version != 0 && cache->offset >= 0) {
        PyObject *value = *(PyObject **)((char *)obj + cache->offset);
        if (value != NULL)
            return Py_NewRef(value);
    }
    return PyObject_GetAttr(obj, name);
}

/* A new instance of `type` (RecordFields or a subclass) following `batch`. */
static PyObject *
make_fields(PyTypeObject *type, PyObject *batch, PyObject *offset_delta, PyObject *timestamp)
{
    RecordFields *self = (RecordFields *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->batch = Py_NewRef(batch);
    self->offset_delta = Py_NewRef(offset_delta);
    self->timestamp = Py_NewRef(timestamp);
    if (is_batch(batch)) {
        BatchFields *fields = (BatchFields *)batch;
        if (fields->newest != Py_None) {  /* (None: it let its records go) */
            self->older = fields->newest;  /* (the batch's reference, or NULL) */
            fields->newest = Py_NewRef(self);
            PyObject_GC_UnTrack(self);
        }
        return (PyObject *)self;
    }
    PyObject *untracked = batch_attr(batch, A_UNTRACKED);  /* (another class's list) */
    if (untracked == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            Py_DECREF(self);
            return NULL;
        }
        PyErr_Clear();
    }
    else if (PyList_CheckExact(untracked)) {
        int failed = PyList_Append(untracked, (PyObject *)self);
        Py_DECREF(untracked);
        if (failed) {
            Py_DECREF(self);
            return NULL;
        }
        PyObject_GC_UnTrack(self);
    }
    else
        Py_DECREF(untracked);
    return (PyObject *)self;
}

static PyObject *
fields_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *batch, *offset_delta, *timestamp;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "RecordFuture takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "RecordFuture", 3, 3, &batch, &offset_delta, &timestamp))
        return NULL;
    return make_fields(type, batch, offset_delta, timestamp);
}

static int
fields_traverse(RecordFields *self, visitproc visit, void *arg)
{
    Py_VISIT(self->batch);
    Py_VISIT(self->callback);
    Py_VISIT(self->context);
    Py_VISIT(self->more_callbacks);
    Py_VISIT(self->older);
    return 0;
}

/* Lets go of `node` (a reference its caller held) and of the futures it alone keeps in a
   chain through the field at offset `link` (older), one by one: a batch may
   hold a million records, and freeing the chain by recursion (each future's dealloc
   freeing the next) overflowed the C stack. */
static void
let_go_chain(PyObject *node, Py_ssize_t link)
{
    while (node != NULL) {
        PyObject *next = NULL;
        if (Py_REFCNT(node) == 1 && PyObject_TypeCheck(node, &RecordFieldsType)) {
            PyObject **field = (PyObject **)((char *)node + link);
            next = *field;
            *field = NULL;
        }
        Py_DECREF(node);
        node = next;
    }
}

/* Once its batch let its records go (done), a record's future lets go of the one made
   before it, as its callbacks run or its result is asked: a future a user keeps (awaited,
   given a callback, asked) then keeps no other future of its batch, which the chain made it
   keep (50,000 records of a 1 MiB batch: 6 MB). Its own line is at hand then, and gather's
   futures are let go in the order they were made: the one before was just let go itself. */
static inline void
let_go_older(RecordFields *self)
{
    PyObject *older = self->older;
    if (older != NULL && self->batch != NULL && is_batch(self->batch) &&
        ((BatchFields *)self->batch)->newest == Py_None) {
        self->older = NULL;
        let_go_chain(older, offsetof(RecordFields, older));
    }
}

static int
fields_clear(RecordFields *self)
{
    Py_CLEAR(self->batch);
    Py_CLEAR(self->offset_delta);
    Py_CLEAR(self->timestamp);
    Py_CLEAR(self->callback);
    Py_CLEAR(self->context);
    Py_CLEAR(self->more_callbacks);
    PyObject *older = self->older;
    self->older = NULL;
    let_go_chain(older, offsetof(RecordFields, older));
    return 0;
}

static void
fields_dealloc(RecordFields *self)
{
    PyObject_GC_UnTrack(self);
    fields_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
fields_track(PyObject *self, PyObject *unused)
{
    if (!PyObject_GC_IsTracked(self))
        PyObject_GC_Track(self);
    Py_RETURN_NONE;
}

/* The record's batch, held (NULL and AttributeError if it has none: a cleared future). */
static PyObject *
batch_of(RecordFields *self)
{
    if (self->batch == NULL || self->batch == Py_None) {
        PyErr_SetString(PyExc_AttributeError, "this RecordFuture follows no batch");
        return NULL;
    }
    return Py_NewRef(self->batch);
}

/* The record's batch if it was acknowledged whole (its acked_base is set), borrowed; or
   NULL: then its asyncio future (or its pieces) has the answers. */
static BatchFields *
acked_batch(RecordFields *self)
{
    PyObject *batch = self->batch;
    if (batch == NULL || !is_batch(batch) || ((BatchFields *)batch)->acked_base == NOT_ACKED)
        return NULL;
    return (BatchFields *)batch;
}

/* `method()` of the batch's asyncio future. */
static PyObject *
ask_batch_future(RecordFields *self, PyObject *method)
{
    PyObject *batch = batch_of(self);
    if (batch == NULL)
        return NULL;
    PyObject *future = batch_attr(batch, A_FUTURE);
    Py_DECREF(batch);
    if (future == NULL)
        return NULL;
    PyObject *answer = PyObject_CallMethodNoArgs(future, method);
    Py_DECREF(future);
    return answer;
}

/* 1 if the batch was split (it answers for each record: batch.pieces is not None), 0 if
   not, -1 on error. */
static int
is_split(PyObject *batch)
{
    PyObject *pieces = batch_attr(batch, A_PIECES);
    if (pieces == NULL)
        return -1;
    int split = pieces != Py_None;
    Py_DECREF(pieces);
    return split;
}

static PyObject *
fields_done(RecordFields *self, PyObject *unused)
{
    if (acked_batch(self) != NULL)
        Py_RETURN_TRUE;
    return ask_batch_future(self, s_done);
}

static PyObject *
fields_cancelled(RecordFields *self, PyObject *unused)
{
    if (acked_batch(self) != NULL)
        Py_RETURN_FALSE;
    return ask_batch_future(self, s_cancelled);
}

static PyObject *
fields_get_loop(RecordFields *self, PyObject *unused)
{
    PyObject *batch = self->batch;
    if (batch != NULL && is_batch(batch) &&
        ((BatchFields *)batch)->loop != NULL)
        return Py_NewRef(((BatchFields *)batch)->loop);
    return ask_batch_future(self, s_get_loop);
}

static PyObject *
fields_exception(RecordFields *self, PyObject *unused)
{
    if (acked_batch(self) != NULL)
        Py_RETURN_NONE;
    PyObject *batch = batch_of(self), *answer = NULL;
    if (batch == NULL)
        return NULL;
    int split = is_split(batch);
    if (split == 0)
        answer = ask_batch_future(self, s_exception);
    else if (split == 1)
        answer = PyObject_CallMethodOneArg(batch, s_exception_for, self->offset_delta);
    Py_DECREF(batch);
    return answer;
}

/* An instance of tuple subclass `cls` holding items[0:n], untracked by the garbage collector
   when no item can hold a reference (as the collector does for plain tuples). */
static PyObject *
new_tuple_of(PyTypeObject *cls, PyObject *const *items, Py_ssize_t n)
{
    PyObject *self = cls->tp_alloc(cls, n);
    if (self == NULL)
        return NULL;
    int atomic = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyTuple_SET_ITEM(self, i, Py_NewRef(items[i]));
        if (PyObject_IS_GC(items[i]))
            atomic = 0;
    }
    if (atomic && PyObject_GC_IsTracked(self))
        PyObject_GC_UnTrack(self);
    return self;
}

/* The future class's `_metadata_type` (a tuple subclass), a new reference: remembered for
   the class and its version tag (a class attribute set anew changes the tag), where a
   lookup on the class each record was a sixth of result()'s instructions. */
static struct {
    PyTypeObject *future_type;  /* compared only, never followed */
    unsigned int version;
    PyObject *metadata_type;  /* (held) */
} metadata_types;

static PyObject *
metadata_type_of(PyTypeObject *type)
{
    if (type == metadata_types.future_type && metadata_types.version != 0 &&
        type->tp_version_tag == metadata_types.version)
        return Py_NewRef(metadata_types.metadata_type);
    PyObject *cls = PyObject_GetAttr((PyObject *)type, s_metadata_type);
    if (cls == NULL)
        return NULL;
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        Py_DECREF(cls);
        PyErr_SetString(PyExc_TypeError, "_metadata_type must be a tuple subclass");
        return NULL;
    }
    metadata_types.future_type = type;
    metadata_types.version = version_of(type);
    Py_XSETREF(metadata_types.metadata_type, Py_NewRef(cls));
    return cls;
}

/* A RecordMetadata of the future class's `_metadata_type`: the topic, the partition, the
   record's offset (the batch's base_offset plus its offset delta; -1 if the base is
   unknown: acks=0, or a duplicate), and the log-append time if the topic stamps one (`time`,
   or made from `appended` if NULL), else the record's own timestamp. */
static PyObject *
metadata_of(RecordFields *self, PyObject *topic, PyObject *partition, long long base,
            long long appended, PyObject *time)
{
    PyObject *cls = metadata_type_of(Py_TYPE(self)), *answer = NULL;
    if (cls == NULL)
        return NULL;
    PyObject *items[4] = {Py_NewRef(topic), Py_NewRef(partition), NULL, NULL};
    long long delta = as_long_long(self->offset_delta);
    if (delta == -1 && PyErr_Occurred())
        goto done;
    if (base < 0)
        items[2] = PyLong_FromLong(-1);
    else if (delta >= 0 && base <= LLONG_MAX - delta)
        items[2] = PyLong_FromLongLong(base + delta);
    else {  /* (past int64: a broker's nonsense, summed as Python would) */
        PyObject *first = PyLong_FromLongLong(base);
        items[2] = first == NULL ? NULL : PyNumber_Add(first, self->offset_delta);
        Py_XDECREF(first);
    }
    if (items[2] == NULL)
        goto done;
    items[3] = appended < 0 ? Py_NewRef(self->timestamp)
        : time != NULL ? Py_NewRef(time) : PyLong_FromLongLong(appended);
    if (items[3] != NULL)
        answer = new_tuple_of((PyTypeObject *)cls, items, 4);
done:
    for (int i = 0; i < 4; i++)
        Py_XDECREF(items[i]);
    Py_DECREF(cls);
    return answer;
}

/* The record's RecordMetadata (the type is the future class's `_metadata_type`). */
static PyObject *
fields_result(RecordFields *self, PyObject *unused)
{
    BatchFields *acked = acked_batch(self);
    if (acked != NULL) {  /* (read borrowed: no Python code runs until it is made) */
        PyObject *answer = metadata_of(self, acked->topic, acked->partition,
                                       acked->acked_base, acked->acked_time, NULL);
        let_go_older(self);
        return answer;
    }
    PyObject *batch = batch_of(self);
    if (batch == NULL)
        return NULL;
    PyObject *future = NULL, *outcome = NULL, *topic = NULL, *partition = NULL;
    PyObject *answer = NULL;
    int split = is_split(batch);
    if (split < 0)
        goto done;
    if (split) {
        answer = PyObject_CallMethodObjArgs(batch, s_metadata, self->offset_delta,
                                            self->timestamp, NULL);
        goto done;
    }
    if ((future = batch_attr(batch, A_FUTURE)) == NULL ||
        (outcome = PyObject_CallMethodNoArgs(future, s_result)) == NULL)
        goto done;
    if (!PyTuple_Check(outcome) || PyTuple_GET_SIZE(outcome) != 2) {
        PyErr_SetString(PyExc_TypeError, "a batch's outcome is (base_offset, log_append_time)");
        goto done;
    }
    PyObject *log_append_time = PyTuple_GET_ITEM(outcome, 1);
    long long base = as_long_long(PyTuple_GET_ITEM(outcome, 0));
    if (base == -1 && PyErr_Occurred())
        goto done;
    long long appended = as_long_long(log_append_time);
    if (appended == -1 && PyErr_Occurred())
        goto done;
    if ((topic = batch_attr(batch, A_TOPIC)) != NULL &&
        (partition = batch_attr(batch, A_PARTITION)) != NULL)
        answer = metadata_of(self, topic, partition, base, appended, log_append_time);
done:
    Py_XDECREF(topic);
    Py_XDECREF(partition);
    Py_XDECREF(outcome);
    Py_XDECREF(future);
    Py_DECREF(batch);
    return answer;
}

/* Whether two contextvars.Context hold the very same values: 1, 0, or -1 on error. */
static int
contexts_same(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    Py_ssize_t n = PyObject_Length(a);
    if (n < 0)
        return -1;
    Py_ssize_t m = PyObject_Length(b);
    if (m < 0)
        return -1;
    if (n != m)
        return 0;
    if (n == 0)
        return 1;
    PyObject *keys = PyObject_GetIter(a);
    if (keys == NULL)
        return -1;
    int same = 1;
    PyObject *key;
    while (same && (key = PyIter_Next(keys)) != NULL) {
        PyObject *in_a = PyObject_GetItem(a, key);
        PyObject *in_b = in_a == NULL ? NULL : PyObject_GetItem(b, key);
        Py_DECREF(key);
        if (in_b == NULL) {
            Py_XDECREF(in_a);
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
                Py_DECREF(keys);
                return -1;
            }
            PyErr_Clear();
            same = 0;
            break;
        }
        same = in_a == in_b;
        Py_DECREF(in_a);
        Py_DECREF(in_b);
    }
    Py_DECREF(keys);
    return PyErr_Occurred() ? -1 : same;
}

/* What a done callback added without a context runs in a copy of: records given callbacks in
   one context share this snapshot, where each would otherwise keep a Context of its own for
   the garbage collector to walk until its batch is done (gather over 500k records: 500k). It
   is never entered, so it stays as it was copied. */
static PyObject *snapshot;

/* CPython's Context as laid out in 3.11-3.13 (Include/internal/pycore_context.h): `vars`,
   the immutable mapping of its values, is shared by a context and its copies until one of
   them sets a variable, which gives it a new mapping. So a context whose `vars` is the one
   a live copy holds has the very same values as that copy. */
#if PY_VERSION_HEX < 0x030E0000
#define SEES_CONTEXT_VALUES 1
typedef struct {
    PyObject_HEAD
    PyObject *prev, *vars, *weakreflist;
    int entered;
} ContextLayout;

static inline PyObject *
context_values(PyObject *context)
{
    return ((ContextLayout *)context)->vars;
}
#endif

/* The snapshot of the current context, a new reference: `snapshot` unless the context holds
   other values now (then a new one). gather adds a callback to every record in one
   context: the current context's values are seen to be the snapshot's, where a copy of it
   and its comparison with the snapshot was a fifth of add_done_callback's instructions (more
   with context variables set: each is compared). */
static PyObject *
current_snapshot(void)
{
#ifdef SEES_CONTEXT_VALUES
    PyObject *now = PyThreadState_Get()->context;  /* (NULL: none entered yet) */
    if (snapshot != NULL && now != NULL && PyContext_CheckExact(now) &&
        context_values(now) == context_values(snapshot))
        return Py_NewRef(snapshot);
#endif
    PyObject *current = PyContext_CopyCurrent();
    if (current == NULL)
        return NULL;
    int same = snapshot == NULL ? 0 : contexts_same(current, snapshot);
    if (same < 0) {
        Py_DECREF(current);
        return NULL;
    }
    if (same)
        Py_DECREF(current);
    else
        Py_XSETREF(snapshot, current);
    return Py_NewRef(snapshot);
}

static PyObject *
fields_add_done_callback(RecordFields *self, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs != 1 || keywords > 1 ||
        (keywords == 1 && PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), s_context) != 0)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "add_done_callback(fn, /, *, context=None)");
        return NULL;
    }
    PyObject *fn = args[0], *context = keywords ? args[1] : Py_None, *held;
    if (context == Py_None) {
        if ((held = current_snapshot()) == NULL)
            return NULL;
    }
    else if ((held = PyTuple_Pack(1, context)) == NULL)  /* that very context, as asyncio */
        return NULL;
    int first = self->callback == NULL || self->callback == Py_None;
    if (first && self->more_callbacks != NULL) {
        int more = PyObject_IsTrue(self->more_callbacks);
        if (more < 0) {
            Py_DECREF(held);
            return NULL;
        }
        first = !more;
    }
    if (first) {
        Py_XSETREF(self->callback, Py_NewRef(fn));
        Py_XSETREF(self->context, held);
        PyObject *batch = batch_of(self);
        if (batch == NULL)
            return NULL;
        /* ProducerBatch.watch()'s common case inline (gather: every record after a batch's
           first): the batch has records watched already. */
        int failed = 0;
        if (is_batch(batch) && ((BatchFields *)batch)->watched_count)
            failed = batch_add_watcher((BatchFields *)batch, self) < 0;
        else {
            PyObject *watched = PyObject_CallMethodOneArg(batch, s_watch, (PyObject *)self);
            failed = watched == NULL;
            Py_XDECREF(watched);
        }
        Py_DECREF(batch);
        if (failed)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *entry = PyTuple_Pack(2, fn, held);
    Py_DECREF(held);
    if (entry == NULL)
        return NULL;
    int failed;
    if (self->more_callbacks == NULL || self->more_callbacks == Py_None) {
        PyObject *more = PyList_New(1);
        failed = more == NULL;
        if (more != NULL) {
            PyList_SET_ITEM(more, 0, entry);
            Py_XSETREF(self->more_callbacks, more);
            entry = NULL;
        }
    }
    else
        failed = PyList_Append(self->more_callbacks, entry) < 0;
    Py_XDECREF(entry);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* `await record_future`: the record's metadata, or its failure raised. While the record is
   pending it yields the record's future itself, as `await` on an asyncio future yields that
   future: the Task adds its wake-up as a done callback, which runs with the batch's other
   callbacks (one loop callback per batch, not a handle per record), and a Task cancelled
   meanwhile cancels the future it waits on (which stops following the record: the record is
   still sent). No Python frame and no asyncio future per await. */
typedef struct {
    PyObject_HEAD
    PyObject *record;  /* NULL once it returned */
    int yielded;
} Awaiting;

static PyTypeObject AwaitingType;

static PyObject *
fields_await(PyObject *self)
{
    Awaiting *it = PyObject_GC_New(Awaiting, &AwaitingType);
    if (it == NULL)
        return NULL;
    it->record = Py_NewRef(self);
    it->yielded = 0;
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

static int
awaiting_traverse(Awaiting *self, visitproc visit, void *arg)
{
    Py_VISIT(self->record);
    return 0;
}

static int
awaiting_clear(Awaiting *self)
{
    Py_CLEAR(self->record);
    return 0;
}

static void
awaiting_dealloc(Awaiting *self)
{
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->record);
    PyObject_GC_Del(self);
}

/* A step: the record's future if it is pending and not yielded yet, else its result. */
static PySendResult
awaiting_am_send(Awaiting *self, PyObject *arg, PyObject **result)
{
    RecordFields *record = (RecordFields *)self->record;
    if (record == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited future");
        return PYGEN_ERROR;
    }
    if (!self->yielded) {
        PyObject *done = fields_done(record, NULL);
        if (done == NULL)
            return PYGEN_ERROR;
        int is_done = PyObject_IsTrue(done);
        Py_DECREF(done);
        if (is_done < 0)
            return PYGEN_ERROR;
        if (!is_done) {
            self->yielded = 1;
            *result = Py_NewRef((PyObject *)record);
            return PYGEN_NEXT;
        }
    }
    PyObject *value = fields_result(record, NULL);
    Py_CLEAR(self->record);
    if (value == NULL)
        return PYGEN_ERROR;
    *result = value;
    return PYGEN_RETURN;
}

/* The same step through the iterator protocol (`yield from`, or a tracer's SEND). */
static PyObject *
awaiting_next(Awaiting *self)
{
    PyObject *result;
    PySendResult status = awaiting_am_send(self, Py_None, &result);
    if (status != PYGEN_RETURN)
        return status == PYGEN_NEXT ? result : NULL;
    PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, result);
    Py_DECREF(result);
    if (stop != NULL) {
        PyErr_SetObject(PyExc_StopIteration, stop);
        Py_DECREF(stop);
    }
    return NULL;
}

static PyObject *
awaiting_send(Awaiting *self, PyObject *value)
{
    return awaiting_next(self);
}

static PyObject *
awaiting_self(PyObject *self)
{
    return Py_NewRef(self);
}

static PyMethodDef awaiting_methods[] = {
    {"send", (PyCFunction)awaiting_send, METH_O,
     "One step: the record's future while it is pending, then StopIteration(metadata)."},
    {NULL}
};

static PyAsyncMethods awaiting_async = {
    .am_send = (sendfunc)awaiting_am_send,
};

static PyTypeObject AwaitingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioproducer._speedups._c.Awaiting",
    .tp_doc = "What `await record_future` iterates: the future while pending, then its result.",
    .tp_basicsize = sizeof(Awaiting),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)awaiting_dealloc,
    .tp_traverse = (traverseproc)awaiting_traverse,
    .tp_clear = (inquiry)awaiting_clear,
    .tp_as_async = &awaiting_async,
    .tp_iter = awaiting_self,
    .tp_iternext = (iternextfunc)awaiting_next,
    .tp_methods = awaiting_methods,
};

/* asyncio's mark of a future a Task waits on: always true here, as a record's future reaches
   a Task only from its own await while pending (the Task's reset to False is ignored). */
static PyObject *
fields_blocking(PyObject *self, void *unused)
{
    Py_RETURN_TRUE;
}

static int
fields_set_blocking(PyObject *self, PyObject *value, void *unused)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete _asyncio_future_blocking");
        return -1;
    }
    return 0;
}

static PyGetSetDef fields_getset[] = {
    {"_asyncio_future_blocking", fields_blocking, fields_set_blocking,
     "True: a Task that gets this future waits for it (asyncio's mark of a future).", NULL},
    {NULL}
};

static PyAsyncMethods fields_async = {
    .am_await = fields_await,
};

static PyMethodDef fields_methods[] = {
    {"_track", fields_track, METH_NOARGS,
     "Hand this future to the garbage collector (see the comment in _c.c)."},
    {"done", (PyCFunction)fields_done, METH_NOARGS,
     "Whether the record has its outcome (or the future was cancelled)."},
    {"cancelled", (PyCFunction)fields_cancelled, METH_NOARGS,
     "Whether the future was cancelled (it stopped following its record)."},
    {"get_loop", (PyCFunction)fields_get_loop, METH_NOARGS, "The producer's event loop."},
    {"result", (PyCFunction)fields_result, METH_NOARGS,
     "The metadata if acknowledged; raises the failure, CancelledError if cancelled, or\n"
     "InvalidStateError if pending."},
    {"exception", (PyCFunction)fields_exception, METH_NOARGS,
     "The failure, or None if acknowledged; raises as result() does when cancelled or\n"
     "pending."},
    {"add_done_callback", (PyCFunction)(void (*)(void))fields_add_done_callback,
     METH_FASTCALL | METH_KEYWORDS,
     "add_done_callback(fn, /, *, context=None)\n\n"
     "Call fn(self) once the record is acknowledged, failed or cancelled (soon, from the loop,\n"
     "in `context` or a copy of the current one, as asyncio futures do)."},
    {NULL}
};

static PyMemberDef fields_members[] = {
    {"_batch", T_OBJECT, offsetof(RecordFields, batch), 0, NULL},
    {"_offset_delta", T_OBJECT, offsetof(RecordFields, offset_delta), 0, NULL},
    {"_timestamp", T_OBJECT, offsetof(RecordFields, timestamp), 0, NULL},
    {"_callback", T_OBJECT, offsetof(RecordFields, callback), 0, NULL},
    {"_context", T_OBJECT, offsetof(RecordFields, context), 0, NULL},
    {"_more_callbacks", T_OBJECT, offsetof(RecordFields, more_callbacks), 0, NULL},
    {NULL}
};

static PyTypeObject RecordFieldsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioproducer._speedups._c.RecordFields",
    .tp_doc = "A RecordFuture's fields and the part of asyncio's Future protocol asyncio calls, "
              "untracked by the garbage collector until the future may be in a reference cycle.",
    .tp_basicsize = sizeof(RecordFields),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = fields_new,
    .tp_dealloc = (destructor)fields_dealloc,
    .tp_traverse = (traverseproc)fields_traverse,
    .tp_clear = (inquiry)fields_clear,
    .tp_methods = fields_methods,
    .tp_members = fields_members,
    .tp_getset = fields_getset,
    .tp_as_async = &fields_async,
    .tp_iter = fields_await,
};

/* A copy of a snapshot that the callbacks of one run share in turn, where a copy each was
   ~250 instructions a record: one that changes it (sets or resets a variable: the copy's
   values are no longer the snapshot's) leaves the next callback a fresh copy. So each
   callback still starts in the snapshot's values and what it sets is seen by no other, as
   with a copy each (asyncio's); a callback cannot get the Context it runs in itself
   (copy_context() copies it). */
typedef struct {
    PyObject *of, *copy;  /* (held, or NULL) */
} SharedCopy;

/* Run one done callback: fn(record) in `held` (a 1-tuple: that very context; else a copy of
   the snapshot it holds, `shared`'s if given). 0 if it ran (what it raised reported by
   `report`), -1 if it raised SystemExit or KeyboardInterrupt, or the report failed. */
static int
run_callback(PyObject *record, PyObject *fn, PyObject *held, PyObject *report,
             SharedCopy *shared)
{
    PyObject *context, *result = NULL;
    if (PyTuple_Check(held) && PyTuple_GET_SIZE(held) == 1) {
        context = Py_NewRef(PyTuple_GET_ITEM(held, 0));
        shared = NULL;
    }
#ifdef SEES_CONTEXT_VALUES
    else if (shared != NULL && PyContext_CheckExact(held)) {
        if (shared->copy == NULL || shared->of != held) {
            Py_XSETREF(shared->copy, PyContext_Copy(held));
            Py_XSETREF(shared->of, Py_NewRef(held));
        }
        context = Py_XNewRef(shared->copy);
    }
#endif
    else {
        context = PyContext_Copy(held);
        shared = NULL;
    }
    if (context != NULL) {
        if (PyContext_Enter(context) == 0) {
            result = PyObject_CallOneArg(fn, record);
#ifdef SEES_CONTEXT_VALUES
            if (shared != NULL && context_values(context) != context_values(held))
                Py_CLEAR(shared->copy);  /* (changed: not for the next callback) */
#endif
            if (PyContext_Exit(context) < 0)
                Py_CLEAR(result);
        }
        Py_DECREF(context);
    }
    if (result != NULL) {
        Py_DECREF(result);
        return 0;
    }
    if (PyErr_ExceptionMatches(PyExc_SystemExit) ||
        PyErr_ExceptionMatches(PyExc_KeyboardInterrupt))
        return -1;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *error = PyErr_GetRaisedException();
#else
    PyObject *type, *error, *traceback;
    PyErr_Fetch(&type, &error, &traceback);
    PyErr_NormalizeException(&type, &error, &traceback);
    if (traceback != NULL)
        PyException_SetTraceback(error, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
#endif
    PyObject *reported = PyObject_CallFunctionObjArgs(report, record, fn, error, NULL);
    Py_XDECREF(error);
    if (reported == NULL)
        return -1;
    Py_DECREF(reported);
    return 0;
}

/* run_callbacks asks a record's future for its fields RUN_AHEAD records ahead of the one
   it runs: a batch's watched records are cold when it completes (at 10,000 partitions each
   was appended among 10,000 other batches' records), and their loads then overlap the
   callbacks run meanwhile. The fields it reads are the object's first 64 bytes, which may
   span two lines. */
#define RUN_AHEAD 2

static inline void
fetch_record(PyObject *record)
{
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(record, 1);
    __builtin_prefetch((char *)record + offsetof(RecordFields, more_callbacks), 1);
#else
    (void)record;
#endif
}

static PyObject *
py_run_callbacks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 2, "run_callbacks(report, records)"))
        return NULL;
    PyObject *report = args[0], *records = args[1];
    if (!PyList_CheckExact(records)) {
        PyErr_SetString(PyExc_TypeError, "run_callbacks takes a list of records' futures");
        return NULL;
    }
    Py_INCREF(records);
    SharedCopy shared = {NULL, NULL};
    Py_ssize_t i = 0;
    for (; i < PyList_GET_SIZE(records); i++) {
        if (i + RUN_AHEAD < PyList_GET_SIZE(records))
            fetch_record(PyList_GET_ITEM(records, i + RUN_AHEAD));
        PyObject *item = Py_NewRef(PyList_GET_ITEM(records, i));
        if (!PyObject_TypeCheck(item, &RecordFieldsType)) {
            Py_DECREF(item);
            PyErr_SetString(PyExc_TypeError, "run_callbacks takes a list of records' futures");
            goto error;
        }
        RecordFields *record = (RecordFields *)item;
        record->watched = 0;  /* (a batch handed it over to run: a callback added now is its) */
        let_go_older(record);
        PyObject *fn = record->callback, *held = record->context;
        PyObject *more = Py_XNewRef(record->more_callbacks);
        int failed = 0;
        if (fn != NULL && fn != Py_None) {
            record->callback = record->context = NULL;  /* (read as None) */
            failed = held == NULL ? (PyErr_SetString(PyExc_TypeError, "a callback without "
                                                     "its context"), -1)
                                  : run_callback(item, fn, held, report, &shared);
            Py_DECREF(fn);
            Py_XDECREF(held);
        }
        if (!failed && more != NULL && more != Py_None) {
            int any = PyObject_IsTrue(more);
            failed = any < 0;
            if (any > 0) {
                Py_CLEAR(record->more_callbacks);
                if (!PyList_Check(more)) {
                    PyErr_SetString(PyExc_TypeError, "_more_callbacks must be a list");
                    failed = 1;
                }
                for (Py_ssize_t j = 0; !failed && j < PyList_GET_SIZE(more); j++) {
                    PyObject *entry = Py_NewRef(PyList_GET_ITEM(more, j));
                    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2) {
                        PyErr_SetString(PyExc_TypeError, "a callback is (fn, context)");
                        failed = 1;
                    }
                    else
                        failed = run_callback(item, PyTuple_GET_ITEM(entry, 0),
                                              PyTuple_GET_ITEM(entry, 1), report,
                                              &shared) < 0;
                    Py_DECREF(entry);
                }
            }
        }
        Py_XDECREF(more);
        Py_DECREF(item);
        if (failed) {
            i++;
            goto error;
        }
    }
    Py_XDECREF(shared.of);
    Py_XDECREF(shared.copy);
    Py_DECREF(records);
    Py_RETURN_NONE;
error:  /* the records not reached are watched by no batch now: a callback added later is run */
    for (; i < PyList_GET_SIZE(records); i++) {
        PyObject *item = PyList_GET_ITEM(records, i);
        if (PyObject_TypeCheck(item, &RecordFieldsType))
            ((RecordFields *)item)->watched = 0;
    }
    Py_XDECREF(shared.of);
    Py_XDECREF(shared.copy);
    Py_DECREF(records);
    return NULL;
}

/* Whether two contextvars.Context hold the very same values: identity, not ==, which a
   value may not answer (a numpy array) or answer slowly, and which would let a callback run
   with an equal object in place of the one set. */
static PyObject *
py_same_context(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 2, "same_context(a, b)"))
        return NULL;
    if (!PyContext_CheckExact(args[0]) || !PyContext_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "same_context takes two contextvars.Context");
        return NULL;
    }
    int same = contexts_same(args[0], args[1]);
    if (same < 0)
        return NULL;
    return Py_NewRef(same ? Py_True : Py_False);
}

/* RecordMetadata, a NamedTuple, is what gather returns for every record. The collector
   untracks plain tuples of atomic values (strings, numbers) as it meets them, but not
   instances of tuple subclasses: hundreds of thousands of metadata would each be walked by
   every full collection. new_tuple() makes them as tuple.__new__ does, untracked when no item
   can hold a reference. */
static PyObject *
py_new_tuple(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 2, "new_tuple(cls, items)"))
        return NULL;
    if (!PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type) ||
        !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "new_tuple takes a tuple subclass and a tuple");
        return NULL;
    }
    return new_tuple_of((PyTypeObject *)args[0], &PyTuple_GET_ITEM(args[1], 0),
                        PyTuple_GET_SIZE(args[1]));
}

/* -- append_record: enqueue()'s and send()'s common case ------------------------------------ */

static PyObject *
py_append_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 8, "append_record(batches, writers, partition, timestamp, key, "
                    "value, headers, future_type)"))
        return NULL;
    PyObject *batches = args[0], *writers = args[1], *future_type = args[7];
    if (!PyList_CheckExact(batches) || !PyList_CheckExact(writers) ||
        PyList_GET_SIZE(batches) != PyList_GET_SIZE(writers)) {
        PyErr_SetString(PyExc_TypeError, "append_record takes lists of batches and writers, "
                        "one entry per partition");
        return NULL;
    }
    if (!PyType_Check(future_type) ||
        !PyType_IsSubtype((PyTypeObject *)future_type, &RecordFieldsType)) {
        PyErr_SetString(PyExc_TypeError, "append_record makes RecordFields subclasses");
        return NULL;
    }
    Py_ssize_t partition = PyLong_AsSsize_t(args[2]);
    if (partition == -1 && PyErr_Occurred())
        return NULL;
    long long timestamp = as_long_long(args[3]);
    if (timestamp == -1 && PyErr_Occurred())
        return NULL;
    const char *data[3];
    Py_ssize_t length[3];
    for (int i = 0; i < 3; i++) {
        PyObject *given = args[4 + i];
        if (given == Py_None) {
            data[i] = NULL;
            length[i] = 0;
        }
        else if (PyBytes_CheckExact(given)) {
            data[i] = PyBytes_AS_STRING(given);
            length[i] = PyBytes_GET_SIZE(given);
        }
        else {
            PyErr_SetString(PyExc_TypeError, "append_record takes key, value and headers as "
                            "bytes or None");
            return NULL;
        }
    }
    /* The types first, then the partition, as in the Python twin (a str key is a TypeError
       whatever the partition). */
    if (partition < 0 || partition >= PyList_GET_SIZE(writers))
        Py_RETURN_NONE;
    PyObject *writer = PyList_GET_ITEM(writers, partition);
    if (writer == Py_None)
        Py_RETURN_NONE;
    if (!PyObject_TypeCheck(writer, &RecordWriterType)) {
        PyErr_SetString(PyExc_TypeError, "writers must hold RecordWriter or None");
        return NULL;
    }
    /* No Python code runs from the list reads to here: the lists are as they were. */
    RecordWriter *w = (RecordWriter *)writer;
    int appended = writer_append(w, timestamp, data[0], length[0], data[1], length[1],
                                 data[2], length[2]);
    if (appended <= 0)
        return appended < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *batch = Py_NewRef(PyList_GET_ITEM(batches, partition));
    PyObject *delta = PyLong_FromSsize_t(w->count - 1);
    PyObject *future = delta == NULL ? NULL
        : make_fields((PyTypeObject *)future_type, batch, delta, args[3]);
    Py_XDECREF(delta);
    Py_DECREF(batch);
    return future;
}

/* -- Columns: enqueue_many's records as Arrow-layout columns -------------------------------- */

/* One column of binary cells in Arrow's variable-size binary layout, read where it lies:
 * a validity bitmap (bit i of byte i / 8, least significant first; none: every cell is set),
 * offsets (int32, or int64 for Arrow's large types, native byte order: cell i is
 * data[offsets[i]:offsets[i + 1]]) and the data; `first` is the first row's index into the
 * offsets and the bitmap (an Arrow slice's offset). The buffers are held until the Columns
 * go. `present` 0: every cell is null (no key column). */
typedef struct {
    Py_buffer validity, offsets, data;
    int present, has_validity, offset_size;
    Py_ssize_t first;
} BinaryColumn;

typedef struct {
    PyObject_HEAD
    Py_ssize_t count;
    BinaryColumn keys, values;
} Columns;

static PyTypeObject ColumnsType;

static inline int64_t
column_offset(const BinaryColumn *c, Py_ssize_t i)
{
    const char *at = (const char *)c->offsets.buf + i * c->offset_size;
    if (c->offset_size == 8) {
        int64_t o;
        memcpy(&o, at, 8);
        return o;
    }
    int32_t o;
    memcpy(&o, at, 4);
    return o;
}

/* Row `row`'s cell: its bytes and length, or NULL for a null cell. (An empty cell is "",
 * not NULL: the data buffer of a column of empty cells may have no address.) */
static inline const char *
column_cell(const BinaryColumn *c, Py_ssize_t row, Py_ssize_t *length)
{
    *length = 0;
    if (!c->present)
        return NULL;
    Py_ssize_t i = c->first + row;
    if (c->has_validity && !((((const unsigned char *)c->validity.buf)[i >> 3] >> (i & 7)) & 1))
        return NULL;
    int64_t start = column_offset(c, i);
    *length = (Py_ssize_t)(column_offset(c, i + 1) - start);
    return c->data.buf != NULL ? (const char *)c->data.buf + start : "";
}

static void
column_release(BinaryColumn *c)
{
    if (!c->present)
        return;
    if (c->has_validity)
        PyBuffer_Release(&c->validity);
    PyBuffer_Release(&c->offsets);
    PyBuffer_Release(&c->data);
    c->present = 0;
}

/* A column from (validity, offsets, data, first, offset_size), checked: the buffers long
 * enough for `count` rows from `first`, the offsets from first to last rising and within the
 * data (so no cell is read outside its buffer). `name` is for the errors. */
static int
column_init(BinaryColumn *c, PyObject *spec, Py_ssize_t count, const char *name)
{
    memset(c, 0, sizeof(*c));
    if (!PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) != 5) {
        PyErr_Format(PyExc_TypeError, "Columns' %s must be (validity, offsets, data, first, "
                     "offset_size)%s", name, strcmp(name, "keys") ? "" : " or None");
        return -1;
    }
    PyObject *validity = PyTuple_GET_ITEM(spec, 0);
    Py_ssize_t first = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 3));
    if (first == -1 && PyErr_Occurred())
        return -1;
    Py_ssize_t offset_size = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 4));
    if (offset_size == -1 && PyErr_Occurred())
        return -1;
    if (first < 0 || (offset_size != 4 && offset_size != 8)) {
        PyErr_Format(PyExc_ValueError, "Columns' %s: first must be >= 0 and offset_size 4 or 8",
                     name);
        return -1;
    }
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(spec, 1), &c->offsets, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(spec, 2), &c->data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&c->offsets);
        return -1;
    }
    c->present = 1;
    if (validity != Py_None) {
        if (PyObject_GetBuffer(validity, &c->validity, PyBUF_SIMPLE) < 0)
            goto error;
        c->has_validity = 1;
    }
    c->first = first;
    c->offset_size = (int)offset_size;
    Py_ssize_t offsets = c->offsets.len / offset_size;  /* (checked so, no sum overflows) */
    if (first >= offsets || count > offsets - first - 1 ||
        (c->has_validity && c->validity.len < (first + count + 7) / 8)) {
        PyErr_Format(PyExc_ValueError, "Columns' %s: a buffer is too short for %zd rows from "
                     "row %zd", name, count, first);
        goto error;
    }
    int64_t previous = column_offset(c, first);
    if (previous < 0)
        goto bad_offsets;
    for (Py_ssize_t i = first + 1; i <= first + count; i++) {
        int64_t next = column_offset(c, i);
        if (next < previous)
            goto bad_offsets;
        previous = next;
    }
    if (previous > c->data.len)
        goto bad_offsets;
    return 0;
bad_offsets:
    PyErr_Format(PyExc_ValueError, "Columns' %s: the offsets must rise from 0 or more to at "
                 "most the data's length", name);
error:
    column_release(c);
    return -1;
}

static PyObject *
columns_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"count", "keys", "values", NULL};
    Py_ssize_t count;
    PyObject *keys, *values;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nOO", names, &count, &keys, &values))
        return NULL;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "Columns' count must be >= 0");
        return NULL;
    }
    Columns *self = (Columns *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->count = count;
    if ((keys != Py_None && column_init(&self->keys, keys, count, "keys") < 0) ||
        column_init(&self->values, values, count, "values") < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
columns_dealloc(Columns *self)
{
    column_release(&self->keys);
    column_release(&self->values);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
columns_length(Columns *self)
{
    return self->count;
}

static PyObject *
cell_bytes(const BinaryColumn *c, Py_ssize_t row)
{
    Py_ssize_t length;
    const char *cell = column_cell(c, row, &length);
    return cell == NULL ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize(cell, length);
}

/* Row `row` as a (key, value) tuple of bytes or None: what the Python path takes of a row
 * the compiled loop stops at. */
static PyObject *
columns_item(Columns *self, Py_ssize_t row)
{
    if (row < 0 || row >= self->count) {
        PyErr_SetString(PyExc_IndexError, "Columns index out of range");
        return NULL;
    }
    PyObject *key = cell_bytes(&self->keys, row);
    if (key == NULL)
        return NULL;
    PyObject *value = cell_bytes(&self->values, row);
    if (value == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    PyObject *pair = PyTuple_Pack(2, key, value);
    Py_DECREF(key);
    Py_DECREF(value);
    return pair;
}

static PySequenceMethods columns_as_sequence = {
    .sq_length = (lenfunc)columns_length,
    .sq_item = (ssizeargfunc)columns_item,
};

static PyTypeObject ColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioproducer._speedups._c.Columns",
    .tp_doc = "Columns(count, keys, values): records for enqueue_many as two columns in\n"
              "Arrow's binary layout, read where they lie; a sequence of (key, value) pairs.\n"
              "Each column is (validity, offsets, data, first, offset_size); keys may be None.",
    .tp_basicsize = sizeof(Columns),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = columns_new,
    .tp_dealloc = (destructor)columns_dealloc,
    .tp_as_sequence = &columns_as_sequence,
    .tp_iter = PySeqIter_New,
};

/* -- append_many -------------------------------------------------------------------------- */

enum { DONE = 0, NEEDS_BATCH = 1, NEEDS_PYTHON = 2 };

/* One append_many call: where its records go, what it has written to out_deltas. */
typedef struct {
    PyObject *batches, *writers, *out_batches, *out_deltas;
    Py_ssize_t partitions, fixed, sticky, deltas_length;
    long long timestamp;
} ManyCall;

/* Append one record (key and value NULL when null): 1 appended; 0 the loop stops, with
 * *status and *partition (NEEDS_BATCH: the record's partition has no writer or a full one;
 * NEEDS_PYTHON: keyless and no sticky partition); -1 an error. `left`: records after it. */
static inline int
append_one(ManyCall *call, const char *k, Py_ssize_t k_length, const char *v,
           Py_ssize_t v_length, Py_ssize_t left, int *status, Py_ssize_t *partition)
{
    Py_ssize_t p;
    if (call->fixed >= 0)
        p = call->fixed;
    else if (k != NULL)
        p = partition_of((const unsigned char *)k, k_length, call->partitions);
    else if (call->sticky >= 0)
        p = call->sticky;
    else {
        *status = NEEDS_PYTHON;
        return 0;
    }
    PyObject *writer = PyList_GET_ITEM(call->writers, p);
    if (writer == Py_None) {
        *status = NEEDS_BATCH;
        *partition = p;
        return 0;
    }
    if (!PyObject_TypeCheck(writer, &RecordWriterType)) {
        PyErr_SetString(PyExc_TypeError, "writers must hold RecordWriter or None");
        return -1;
    }
    RecordWriter *w = (RecordWriter *)writer;
    int appended = writer_append(w, call->timestamp, k, k_length, v, v_length, NULL, 0);
    if (appended <= 0) {
        *status = NEEDS_BATCH;
        *partition = p;
        return appended;
    }
    PyObject *out_deltas = call->out_deltas;
    if (call->deltas_length + 4 > PyByteArray_GET_SIZE(out_deltas)) {
        /* Room for some more, not for every record left: at many partitions the loop stops
         * for a new batch every record or two, and sizing the array for the rest of the
         * call, then back, at each stop copied it each time. */
        Py_ssize_t room = call->deltas_length / 8 + 256;
        if (room > (left + 1) * 4)
            room = (left + 1) * 4;
        if (PyByteArray_Resize(out_deltas, call->deltas_length + room) < 0)
            return -1;
    }
    if (PyList_Append(call->out_batches, PyList_GET_ITEM(call->batches, p)) < 0)
        return -1;
    int32_t delta = (int32_t)(w->count - 1);
    memcpy(PyByteArray_AS_STRING(out_deltas) + call->deltas_length, &delta, 4);
    call->deltas_length += 4;
    return 1;
}

static PyObject *
py_append_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 9, "append_many(records, start, batches, writers, "
                    "partition, sticky, timestamp, out_batches, out_deltas)"))
        return NULL;
    PyObject *records = args[0];
    ManyCall call = {.batches = args[2], .writers = args[3], .out_batches = args[7],
                     .out_deltas = args[8]};
    Py_ssize_t start;
    if ((start = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())
        return NULL;
    if ((call.fixed = PyLong_AsSsize_t(args[4])) == -1 && PyErr_Occurred())
        return NULL;
    if ((call.sticky = PyLong_AsSsize_t(args[5])) == -1 && PyErr_Occurred())
        return NULL;
    if ((call.timestamp = as_long_long(args[6])) == -1 && PyErr_Occurred())
        return NULL;
    int columns = Py_IS_TYPE(records, &ColumnsType);
    if ((!columns && !PyList_CheckExact(records)) || !PyList_CheckExact(call.batches) ||
        !PyList_CheckExact(call.writers) || !PyList_CheckExact(call.out_batches) ||
        !PyByteArray_CheckExact(call.out_deltas)) {
        PyErr_SetString(PyExc_TypeError, "append_many takes a list of records (or Columns), "
                        "lists of batches, writers and out_batches, and a bytearray of "
                        "out_deltas");
        return NULL;
    }
    call.partitions = PyList_GET_SIZE(call.writers);
    if (call.partitions == 0 || PyList_GET_SIZE(call.batches) != call.partitions ||
        call.fixed >= call.partitions || call.sticky >= call.partitions) {
        PyErr_SetString(PyExc_ValueError, "batches and writers need one entry per partition");
        return NULL;
    }
    Py_ssize_t n = columns ? ((Columns *)records)->count : PyList_GET_SIZE(records);
    call.deltas_length = PyByteArray_GET_SIZE(call.out_deltas);
    if (start < 0)
        start = 0;
    int status = DONE, done = 1;
    Py_ssize_t i = start, partition = -1;
    /* No Python code runs in this loop (exact bytes and tuples, or Columns, which do not
     * change), so no list changes. */
    if (columns) {
        const Columns *c = (const Columns *)records;
        for (; i < n; i++) {
            Py_ssize_t k_length, v_length;
            const char *k = column_cell(&c->keys, i, &k_length);
            const char *v = column_cell(&c->values, i, &v_length);
            if ((done = append_one(&call, k, k_length, v, v_length, n - i - 1, &status,
                                   &partition)) <= 0)
                break;
        }
    }
    else {
        for (; i < n; i++) {
            PyObject *record = PyList_GET_ITEM(records, i);
            if (!PyTuple_CheckExact(record) || PyTuple_GET_SIZE(record) != 2) {
                status = NEEDS_PYTHON;
                break;
            }
            PyObject *key = PyTuple_GET_ITEM(record, 0), *value = PyTuple_GET_ITEM(record, 1);
            if ((key != Py_None && !PyBytes_CheckExact(key)) ||
                (value != Py_None && !PyBytes_CheckExact(value))) {
                status = NEEDS_PYTHON;
                break;
            }
            const char *k = key == Py_None ? NULL : PyBytes_AS_STRING(key);
            const char *v = value == Py_None ? NULL : PyBytes_AS_STRING(value);
            if ((done = append_one(&call, k, key == Py_None ? 0 : PyBytes_GET_SIZE(key), v,
                                   value == Py_None ? 0 : PyBytes_GET_SIZE(value), n - i - 1,
                                   &status, &partition)) <= 0)
                break;
        }
    }
    if (PyByteArray_Resize(call.out_deltas, call.deltas_length) < 0 || done < 0)
        return NULL;
    if (status != NEEDS_BATCH)
        partition = -1;
    return Py_BuildValue("(nin)", i, status, partition);
}

/* -- watch_batches: an enqueue_many future's batches ---------------------------------------- */

static PyObject *s_bulks;  /* interned at import */

/* One enqueue_many call of 10,000 records at 10,000 partitions touches ~6,300 batches: each
 * pending one is told of its future here, in one pass, rather than in a Python loop. */
static PyObject *
py_watch_batches(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 2, "watch_batches(batches, bulk)"))
        return NULL;
    PyObject *batches = args[0], *bulk = args[1];
    if (!PyList_CheckExact(batches)) {
        PyErr_SetString(PyExc_TypeError, "watch_batches takes a list of batches");
        return NULL;
    }
    Py_ssize_t pending = 0;
    PyObject *last = NULL;  /* (records in a row often share a batch) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batches); i++) {
        PyObject *batch = PyList_GET_ITEM(batches, i);
        if (batch == last)
            continue;
        last = batch;
        /* A batch already told of `bulk` has it last in its _bulks: it was told in this
           pass (a set of the batches seen was a lookup per record, 5% of enqueue_many's
           CPU at 10,000 partitions). A BatchFields' fields are read where they lie. */
        int fields = is_batch(batch);
        PyObject *bulks = fields ? Py_NewRef(((BatchFields *)batch)->bulks)
                                 : PyObject_GetAttr(batch, s_bulks);
        if (bulks == NULL)
            return NULL;
        if (PyList_CheckExact(bulks) && PyList_GET_SIZE(bulks) > 0 &&
            PyList_GET_ITEM(bulks, PyList_GET_SIZE(bulks) - 1) == bulk) {
            Py_DECREF(bulks);
            continue;
        }
        PyObject *done = fields ? Py_NewRef(((BatchFields *)batch)->done)
                                : PyObject_GetAttr(batch, s_done);
        int is_done = done == NULL ? -1 : PyObject_IsTrue(done);
        Py_XDECREF(done);
        if (is_done != 0) {
            Py_DECREF(bulks);
            if (is_done < 0)
                return NULL;
            continue;
        }
        int failed;
        if (bulks == Py_None) {
            PyObject *list = PyList_New(1);
            failed = list == NULL;
            if (!failed) {
                PyList_SET_ITEM(list, 0, Py_NewRef(bulk));
                /* A pending batch the accumulator opened is out of the collector's way, and
                   so is its list while it is (its _track() hands both back): one a batch,
                   kept while it is pending, they were promoted, and set off a full
                   collection in enqueue_many at 10,000 partitions. */
                if (fields && !PyObject_GC_IsTracked(batch))
                    PyObject_GC_UnTrack(list);
                failed = PyObject_SetAttr(batch, s_bulks, list) < 0;
                Py_DECREF(list);
            }
        }
        else if (PyList_CheckExact(bulks)) {
            failed = PyList_Append(bulks, bulk) < 0;
        }
        else {
            PyErr_SetString(PyExc_TypeError, "a batch's _bulks must be a list or None");
            failed = 1;
        }
        Py_DECREF(bulks);
        if (failed)
            return NULL;
        pending++;
    }
    return PyLong_FromSsize_t(pending);
}

/* -- Produce requests and responses ------------------------------------------------------- */

/* Versions 3 to 13, as protocol/messages.py declares them; flexible (KIP-482) from 9, topics
 * named by their id (KIP-516: its 16 bytes, a bytes object in the body as on the wire) from
 * 13. Only what the sender writes and a healthy broker answers: anything else returns None
 * and the generated codec, which knows every case and raises the right error, takes over. */

#define PRODUCE_FIRST 3
#define PRODUCE_LAST 13
#define PRODUCE_FLEXIBLE 9
#define PRODUCE_TOPIC_ID 13

static PyObject *s_transactional_id, *s_acks, *s_timeout_ms, *s_topic_data, *s_name,
    *s_partition_data, *s_index, *s_records, *s_responses, *s_partition_responses,
    *s_error_code, *s_base_offset, *s_log_append_time_ms, *s_log_start_offset,
    *s_record_errors, *s_error_message, *s_throttle_time_ms, *s_topic_id;

/* Size of a length (or count) prefix: compact (uvarint of n + 1) or int16/int32. */
static inline Py_ssize_t
prefix_size(int flexible, Py_ssize_t n, int fixed)
{
    return flexible ? uvarint_size((uint64_t)(n + 1)) : fixed;
}

static inline char *
put_prefix(char *out, int flexible, Py_ssize_t n, int fixed)
{
    return flexible ? put_uvarint(out, (uint64_t)(n + 1)) : put_be(out, (uint64_t)n, fixed);
}

/* The value at `key` of an exact dict, as a new reference; NULL (no exception) if it is
 * missing or not a dict. A new reference: a lookup may run a foreign key's __eq__, which may
 * drop a value fetched before (a borrowed one would then be freed under us). */
static inline PyObject *
item(PyObject *dict, PyObject *key)
{
    if (!PyDict_CheckExact(dict))
        return NULL;
    PyObject *value = PyDict_GetItemWithError(dict, key);
    if (value == NULL)
        PyErr_Clear();
    Py_XINCREF(value);
    return value;
}

/* A str's UTF-8 (cached by Python), or NULL without an exception if it is not an exact str. */
static inline const char *
utf8(PyObject *obj, Py_ssize_t *length)
{
    if (obj == NULL || !PyUnicode_CheckExact(obj))
        return NULL;
    const char *data = PyUnicode_AsUTF8AndSize(obj, length);
    if (data == NULL)
        PyErr_Clear();
    return data;
}

static inline int
int_in(PyObject *obj, long long low, long long high, long long *out)
{
    if (obj == NULL || !PyLong_CheckExact(obj))
        return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(obj, &overflow);
    return !overflow && *out >= low && *out <= high;
}

/* int_in() of a dict's value. */
static inline int
int_item_in(PyObject *dict, PyObject *key, long long low, long long high, long long *out)
{
    PyObject *value = item(dict, key);
    int ok = int_in(value, low, high, out);
    Py_XDECREF(value);
    return ok;
}

/* The empty tagged-field section that ends a struct in flexible versions; 0: no room. */
static inline int
put_no_tags(char **out, const char *end, int flexible)
{
    if (!flexible)
        return 1;
    if (end - *out < 1)
        return 0;
    *(*out)++ = 0;
    return 1;
}

/* A batch's payload of at least this many bytes goes into a Produce request by reference,
 * not copied: the request is then a list of parts (written with one writev by the
 * transport's writelines). Below it a copy is cheaper than a part (an object, an iovec). */
#define REFERENCE_FROM 16384

/* The payloads a request takes by reference: counted by the size walk (room 0), taken with
 * their offsets in the copied bytes by the write walk. */
typedef struct {
    Py_ssize_t count, room, bytes;
    PyObject **parts;
    Py_ssize_t *at;
    const char *start;  /* of the copied bytes */
} Refs;

/* Walks the body twice: to check it and add up its size (out == NULL), then to write it
 * into [out, end), but for the payloads `refs` takes. Each part is checked against the room
 * left: only the sender's plain dicts come here, but a dict lookup may run a foreign key's
 * __eq__, which could change the body between the walks. A partition's records are bytes,
 * or a batch's (header, payload): header bytes, payload a buffer (a sealed writer's
 * SealedRecords, bytes). Returns the size, references included, or -1 for None (the generated
 * codec). */
static Py_ssize_t
produce_body(PyObject *body, int version, char *out, const char *end, Refs *refs)
{
    int flexible = version >= PRODUCE_FLEXIBLE;
    Py_ssize_t size = 0, part, length, result = -1;
    long long acks, timeout;
    /* Every object used across another lookup is held (see item()); a list that changed
     * under us (a shorter one) ends the walk with -1 rather than a read past its end. */
    PyObject *txn = item(body, s_transactional_id), *topics = item(body, s_topic_data);
    PyObject *topic = NULL, *name_obj = NULL, *partitions = NULL, *partition = NULL,
        *records = NULL;
    Py_buffer payload = {.obj = NULL};
    if (txn == NULL || !int_item_in(body, s_acks, -32768, 32767, &acks) ||
        !int_item_in(body, s_timeout_ms, INT32_MIN, INT32_MAX, &timeout) ||
        topics == NULL || !PyList_CheckExact(topics))
        goto done;
    const char *id = NULL;
    length = -1;
    if (txn != Py_None && ((id = utf8(txn, &length)) == NULL || length > 32767))
        goto done;
    Py_ssize_t topic_count = PyList_GET_SIZE(topics);
    part = prefix_size(flexible, length, 2) + (length > 0 ? length : 0) + 2 + 4 +
           prefix_size(flexible, topic_count, 4);
    size += part;
    if (out) {
        if (end - out < part)
            goto done;
        out = put_prefix(out, flexible, length, 2);  /* -1: null */
        if (length > 0) {
            memcpy(out, id, length);
            out += length;
        }
        out = put_be(out, (uint64_t)acks, 2);
        out = put_be(out, (uint64_t)timeout, 4);
        out = put_prefix(out, flexible, topic_count, 4);
    }
    for (Py_ssize_t t = 0; t < topic_count; t++) {
        if (t >= PyList_GET_SIZE(topics))
            goto done;
        Py_XSETREF(topic, Py_NewRef(PyList_GET_ITEM(topics, t)));
        const char *name;
        if (version >= PRODUCE_TOPIC_ID) {  /* the id: 16 bytes (else the generated codec
                                               writes a missing one, or says why not) */
            Py_XSETREF(name_obj, item(topic, s_topic_id));
            name = name_obj && PyBytes_CheckExact(name_obj) && PyBytes_GET_SIZE(name_obj) == 16
                ? PyBytes_AS_STRING(name_obj) : NULL;
            length = 16;
        } else {
            Py_XSETREF(name_obj, item(topic, s_name));
            name = utf8(name_obj, &length);
        }
        Py_XSETREF(partitions, item(topic, s_partition_data));
        if (name == NULL || length > 32767 || partitions == NULL ||
            !PyList_CheckExact(partitions))
            goto done;
        Py_ssize_t partition_count = PyList_GET_SIZE(partitions);
        Py_ssize_t name_size = version >= PRODUCE_TOPIC_ID ? 16 :
            prefix_size(flexible, length, 2) + length;
        part = name_size + prefix_size(flexible, partition_count, 4);
        size += part;
        if (out) {
            if (end - out < part)
                goto done;
            if (version < PRODUCE_TOPIC_ID)
                out = put_prefix(out, flexible, length, 2);
            memcpy(out, name, length);
            out += length;
            out = put_prefix(out, flexible, partition_count, 4);
        }
        for (Py_ssize_t p = 0; p < partition_count; p++) {
            if (p >= PyList_GET_SIZE(partitions))
                goto done;
            Py_XSETREF(partition, Py_NewRef(PyList_GET_ITEM(partitions, p)));
            long long index;
            if (!int_item_in(partition, s_index, INT32_MIN, INT32_MAX, &index))
                goto done;
            Py_XSETREF(records, item(partition, s_records));
            if (records == NULL)
                goto done;
            PyObject *head = records;  /* (held by records) */
            if (PyTuple_CheckExact(records)) {
                if (PyTuple_GET_SIZE(records) != 2 ||
                    !PyBytes_CheckExact(head = PyTuple_GET_ITEM(records, 0)))
                    goto done;
                if (PyObject_GetBuffer(PyTuple_GET_ITEM(records, 1), &payload,
                                       PyBUF_SIMPLE) < 0) {
                    PyErr_Clear();
                    goto done;
                }
            } else if (records != Py_None && !PyBytes_CheckExact(records)) {
                goto done;
            }
            Py_ssize_t records_length = records == Py_None ? -1 :
                PyBytes_GET_SIZE(head) + (payload.obj ? payload.len : 0);
            if (records_length > INT32_MAX - 1)
                goto done;
            Py_ssize_t referenced = payload.obj && payload.len >= REFERENCE_FROM ? payload.len : 0;
            part = 4 + prefix_size(flexible, records_length, 4) +
                   (records_length > 0 ? records_length : 0) + flexible;
            size += part;
            if (referenced && !out) {
                refs->count++;
                refs->bytes += referenced;
            }
            if (out) {
                if (end - out < part - referenced)
                    goto done;
                out = put_be(out, (uint64_t)index, 4);
                out = put_prefix(out, flexible, records_length, 4);  /* -1: null */
                if (records_length > 0) {
                    memcpy(out, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head));
                    out += PyBytes_GET_SIZE(head);
                }
                if (referenced) {
                    if (refs->count >= refs->room)
                        goto done;
                    /* (as a memoryview: transports write bytes, bytearrays and those) */
                    PyObject *whole = PyTuple_GET_ITEM(records, 1);
                    refs->parts[refs->count] = PyBytes_CheckExact(whole) ||
                        PyMemoryView_Check(whole) ? Py_NewRef(whole)
                        : PyMemoryView_FromObject(whole);
                    if (refs->parts[refs->count] == NULL) {
                        PyErr_Clear();  /* (None: the generated codec copies it) */
                        goto done;
                    }
                    refs->at[refs->count++] = out - refs->start;
                } else if (payload.obj) {
                    memcpy(out, payload.buf, payload.len);
                    out += payload.len;
                }
                if (flexible) *out++ = 0;  /* no tagged fields */
            }
            if (payload.obj)
                PyBuffer_Release(&payload);
        }
        size += flexible;
        if (out && !put_no_tags(&out, end, flexible))
            goto done;
    }
    size += flexible;
    if (out && !put_no_tags(&out, end, flexible))
        goto done;
    result = size;
done:
    if (payload.obj)
        PyBuffer_Release(&payload);
    Py_XDECREF(txn);
    Py_XDECREF(topics);
    Py_XDECREF(topic);
    Py_XDECREF(name_obj);
    Py_XDECREF(partitions);
    Py_XDECREF(partition);
    Py_XDECREF(records);
    return result;
}

static PyObject *
py_encode_produce(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 4, "encode_produce(version, correlation_id, client_id, body)"))
        return NULL;
    long long version, correlation_id;
    Py_ssize_t client_length = -1;
    const char *client = NULL;
    if (!int_in(args[0], PRODUCE_FIRST, PRODUCE_LAST, &version) ||
        !int_in(args[1], INT32_MIN, INT32_MAX, &correlation_id))
        Py_RETURN_NONE;
    if (args[2] != Py_None && ((client = utf8(args[2], &client_length)) == NULL ||
                               client_length > 32767))
        Py_RETURN_NONE;
    int flexible = version >= PRODUCE_FLEXIBLE;
    Refs refs = {0, 0, 0, NULL, NULL, NULL};
    Py_ssize_t body_size = produce_body(args[3], (int)version, NULL, NULL, &refs);
    if (body_size < 0)
        Py_RETURN_NONE;
    /* size, api key, version, correlation id, client id, header tags */
    Py_ssize_t header_size = 4 + 2 + 2 + 4 + 2 + (client_length > 0 ? client_length : 0) +
                             flexible;
    if (header_size + body_size - 4 > INT32_MAX)
        Py_RETURN_NONE;
    Py_ssize_t copied = header_size + body_size - refs.bytes;
    PyObject *frame = PyBytes_FromStringAndSize(NULL, copied), *result = NULL;
    if (frame == NULL)
        return NULL;
    if (refs.count) {
        refs.parts = PyMem_Calloc(refs.count, sizeof(PyObject *));
        refs.at = PyMem_Malloc(refs.count * sizeof(Py_ssize_t));
        if (refs.parts == NULL || refs.at == NULL) {
            refs.count = 0;
            PyErr_NoMemory();
            goto done;
        }
    }
    refs.room = refs.count;
    refs.count = 0;
    char *out = refs.start = PyBytes_AS_STRING(frame);
    out = put_be(out, (uint64_t)(header_size + body_size - 4), 4);
    out = put_be(out, 0, 2);  /* ApiKey.PRODUCE */
    out = put_be(out, (uint64_t)version, 2);
    out = put_be(out, (uint64_t)correlation_id, 4);
    out = put_be(out, (uint64_t)client_length, 2);
    if (client_length > 0) {
        memcpy(out, client, client_length);
        out += client_length;
    }
    if (flexible) *out++ = 0;
    /* A size other than the first walk's: the body changed meanwhile (see produce_body). */
    if (produce_body(args[3], (int)version, out, refs.start + copied, &refs) != body_size ||
        refs.count != refs.room) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (!refs.count) {
        result = Py_NewRef(frame);
        goto done;
    }
    /* The copied bytes cut where each reference goes: [bytes, payload, bytes, ...]. */
    result = PyList_New(0);
    Py_ssize_t from = 0;
    for (Py_ssize_t i = 0; result && i <= refs.count; i++) {
        Py_ssize_t to = i < refs.count ? refs.at[i] : copied;
        PyObject *chunk = to > from ?
            PyBytes_FromStringAndSize(refs.start + from, to - from) : NULL;
        if ((to > from && (chunk == NULL || PyList_Append(result, chunk) < 0)) ||
            (i < refs.count && PyList_Append(result, refs.parts[i]) < 0))
            Py_CLEAR(result);
        Py_XDECREF(chunk);
        from = to;
    }
done:
    for (Py_ssize_t i = 0; i < refs.count; i++)
        Py_XDECREF(refs.parts[i]);
    PyMem_Free(refs.parts);
    PyMem_Free(refs.at);
    Py_DECREF(frame);
    return result;
}

typedef struct {
    const unsigned char *data;
    Py_ssize_t pos, end;
} Cursor;

/* Each read returns 0 when the frame ends first or holds what only the generated codec
 * takes (which then raises the right error or reads the rare field). */
static inline int
read_be(Cursor *c, int bytes, int64_t *out)
{
    if (c->end - c->pos < bytes)
        return 0;
    uint64_t n = 0;
    for (int i = 0; i < bytes; i++)
        n = n << 8 | c->data[c->pos + i];
    c->pos += bytes;
    int shift = 64 - 8 * bytes;
    *out = (int64_t)(n << shift) >> shift;  /* sign-extend */
    return 1;
}

/* A length or count: compact (uvarint minus one) or int16/int32; -1 is null. */
static inline int
read_length(Cursor *c, int flexible, int fixed, int64_t *out)
{
    if (!flexible)
        return read_be(c, fixed, out);
    uint64_t n = 0;
    for (int shift = 0; shift < 35; shift += 7) {
        if (c->pos >= c->end)
            return 0;
        unsigned char byte = c->data[c->pos++];
        n |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *out = (int64_t)n - 1;
            return 1;
        }
    }
    return 0;
}

/* No tagged fields here (a healthy response has none): the byte that says so. */
static inline int
read_no_tags(Cursor *c, int flexible)
{
    if (!flexible)
        return 1;
    if (c->pos >= c->end || c->data[c->pos] != 0)
        return 0;
    c->pos++;
    return 1;
}

/* A string, or None if `nullable` and null; NULL without an exception when it cannot. */
static PyObject *
read_string(Cursor *c, int flexible, int nullable)
{
    int64_t length;
    if (!read_length(c, flexible, 2, &length) || length < -1 || (length == -1 && !nullable) ||
        length > c->end - c->pos)
        return NULL;
    if (length == -1)
        Py_RETURN_NONE;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)c->data + c->pos, length, NULL);
    if (s == NULL)
        PyErr_Clear();
    c->pos += length;
    return s;
}

static int
set_int(PyObject *dict, PyObject *key, int64_t value)
{
    PyObject *n = PyLong_FromLongLong(value);
    if (n == NULL)
        return -1;
    int result = PyDict_SetItem(dict, key, n);
    Py_DECREF(n);
    return result;
}

/* One partition's response into a new dict; NULL: error set, or (none set) not for us. */
static PyObject *
read_partition(Cursor *c, int version)
{
    int flexible = version >= PRODUCE_FLEXIBLE;
    int64_t index, error_code, base_offset, log_append_time, log_start_offset = 0;
    if (!read_be(c, 4, &index) || !read_be(c, 2, &error_code) ||
        !read_be(c, 8, &base_offset) || !read_be(c, 8, &log_append_time) ||
        (version >= 5 && !read_be(c, 8, &log_start_offset)))
        return NULL;
    PyObject *message = NULL;
    if (version >= 8) {
        int64_t record_errors;
        if (!read_length(c, flexible, 4, &record_errors) || record_errors != 0 ||
            (message = read_string(c, flexible, 1)) == NULL)
            return NULL;
    }
    PyObject *p = NULL;
    if (!read_no_tags(c, flexible) || (p = PyDict_New()) == NULL)
        goto done;
    if (set_int(p, s_index, index) < 0 || set_int(p, s_error_code, error_code) < 0 ||
        set_int(p, s_base_offset, base_offset) < 0 ||
        set_int(p, s_log_append_time_ms, log_append_time) < 0 ||
        (version >= 5 && set_int(p, s_log_start_offset, log_start_offset) < 0))
        goto fail;
    if (version >= 8) {
        PyObject *empty = PyList_New(0);
        if (empty != NULL)
            PyObject_GC_UnTrack(empty);  /* (see below) */
        if (empty == NULL || PyDict_SetItem(p, s_record_errors, empty) < 0) {
            Py_XDECREF(empty);
            goto fail;
        }
        Py_DECREF(empty);
        if (PyDict_SetItem(p, s_error_message, message) < 0)
            goto fail;
    }
    /* Ints, a str or None and an empty list, read and let go by the sender: kept from the
       collector (a partition's answer, at many partitions a batch's, counted toward the
       next collection and walked by it). */
    if (PyObject_GC_IsTracked(p))
        PyObject_GC_UnTrack(p);
    goto done;
fail:
    Py_CLEAR(p);
done:
    Py_XDECREF(message);
    return p;
}

/* A list of `read` results; NULL as for read_partition. */
static PyObject *
read_array(Cursor *c, int version, PyObject *(*read)(Cursor *, int))
{
    int64_t count;
    if (!read_length(c, version >= PRODUCE_FLEXIBLE, 4, &count) || count < 0 ||
        count > c->end - c->pos)
        return NULL;
    PyObject *list = PyList_New((Py_ssize_t)count);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *element = read(c, version);
        if (element == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, element);
    }
    return list;
}

/* A topic id: its 16 bytes, as the generated codec reads a "uuid"; NULL as for
 * read_partition. */
static PyObject *
read_uuid(Cursor *c)
{
    if (c->end - c->pos < 16)
        return NULL;
    PyObject *id = PyBytes_FromStringAndSize((const char *)c->data + c->pos, 16);
    c->pos += 16;
    return id;
}

static PyObject *
read_topic(Cursor *c, int version)
{
    int flexible = version >= PRODUCE_FLEXIBLE;
    PyObject *key = version >= PRODUCE_TOPIC_ID ? s_topic_id : s_name;
    PyObject *name = version >= PRODUCE_TOPIC_ID ? read_uuid(c) : read_string(c, flexible, 0);
    PyObject *partitions = NULL, *topic = NULL;
    if (name == NULL || (partitions = read_array(c, version, read_partition)) == NULL ||
        !read_no_tags(c, flexible) || (topic = PyDict_New()) == NULL)
        goto done;
    if (PyDict_SetItem(topic, key, name) < 0 ||
        PyDict_SetItem(topic, s_partition_responses, partitions) < 0)
        Py_CLEAR(topic);
done:
    Py_XDECREF(name);
    Py_XDECREF(partitions);
    return topic;
}

static PyObject *
py_decode_produce(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 2, "decode_produce(version, frame)"))
        return NULL;
    long long version;
    if (!int_in(args[0], PRODUCE_FIRST, PRODUCE_LAST, &version) || !PyBytes_CheckExact(args[1]))
        Py_RETURN_NONE;
    int flexible = version >= PRODUCE_FLEXIBLE;
    Cursor c = {(const unsigned char *)PyBytes_AS_STRING(args[1]), 4, PyBytes_GET_SIZE(args[1])};
    int64_t throttle;
    PyObject *topics = NULL, *body = NULL;
    if (c.end < 4 || !read_no_tags(&c, flexible) ||  /* response header v1's tags */
        (topics = read_array(&c, (int)version, read_topic)) == NULL ||
        !read_be(&c, 4, &throttle) || !read_no_tags(&c, flexible) ||
        (body = PyDict_New()) == NULL)
        goto done;
    if (PyDict_SetItem(body, s_responses, topics) < 0 ||
        set_int(body, s_throttle_time_ms, throttle) < 0)
        Py_CLEAR(body);
done:
    Py_XDECREF(topics);
    if (body == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return body;
}

/* -- produce_parts: a Produce request's partitions, from its batches ----------------------- */

/* A dict of `count` key/value pairs (str keys), untracked when no value can lead back to it
   (ints, bytes, an untracked tuple of those): a request's or a response's per-partition dicts, one
   a batch, which the collector would otherwise count toward its next collection and walk. */
static PyObject *
plain_dict(PyObject *const *pairs, Py_ssize_t count)
{
    PyObject *dict = PyDict_New();
    if (dict == NULL)
        return NULL;
    int plain = 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = pairs[2 * i + 1];
        plain &= !PyObject_IS_GC(value) || !PyObject_GC_IsTracked(value);
        if (PyDict_SetItem(dict, pairs[2 * i], value) < 0) {
            Py_DECREF(dict);
            return NULL;
        }
    }
    if (plain && PyObject_GC_IsTracked(dict))
        PyObject_GC_UnTrack(dict);
    return dict;
}

/* A batch's int field (producer id, epoch, base sequence) within [low, high]; -1 with an
   error set if not. */
static long long
ranged_field(PyObject *value, long long low, long long high, const char *name)
{
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "the batch's %s is not set", name);
        return -1;
    }
    long long n = as_long_long(value);
    if (!(n == -1 && PyErr_Occurred()) && (n < low || n > high)) {
        PyErr_Format(PyExc_OverflowError, "%s is out of range", name);
        return -1;
    }
    return n;
}

/* produce_parts(batches, in_flight, now, sequenced, transactional): see _py.produce_parts.
   One call a request where the sender's loop was ~40 lines of Python a batch (at 10,000
   partitions ~490 batches a request, a batch every 16 records). */
static PyObject *
py_produce_parts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 5, "produce_parts(batches, in_flight, now, sequenced, transactional)"))
        return NULL;
    PyObject *batches = args[0], *in_flight = args[1];
    if (!PyList_CheckExact(batches) || !PyDict_CheckExact(in_flight)) {
        PyErr_SetString(PyExc_TypeError, "produce_parts takes a list of batches and a dict");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[2]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    int sequenced = PyObject_IsTrue(args[3]), transactional = PyObject_IsTrue(args[4]);
    if (sequenced < 0 || transactional < 0)
        return NULL;
    double earliest = Py_HUGE_VAL, waited = 0.0, most = 0.0;
    Py_ssize_t size = 0;
    PyObject *by_topic = PyDict_New(), *result = NULL, *topic_data = NULL;
    if (by_topic == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batches); i++) {
        PyObject *batch = Py_NewRef(PyList_GET_ITEM(batches, i));
        PyObject *header = NULL, *records = NULL, *entry = NULL;
        int ok = 0;
        if (!is_batch(batch)) {
            PyErr_SetString(PyExc_TypeError, "produce_parts takes a list of batches");
            goto next;
        }
        BatchFields *fields = (BatchFields *)batch;
        if (fields->writer == NULL || fields->topic == NULL || fields->partition == NULL ||
            fields->created == NULL || fields->deadline == NULL) {
            PyErr_SetString(PyExc_AttributeError, "the batch's fields are not set");
            goto next;
        }
        double deadline = PyFloat_AsDouble(fields->deadline);
        double created = PyFloat_AsDouble(fields->created);
        if ((deadline == -1.0 || created == -1.0) && PyErr_Occurred())
            goto next;
        if (deadline < earliest)
            earliest = deadline;
        double queued = now - created;
        waited += queued;
        if (queued > most)
            most = queued;
        if (!PyObject_TypeCheck(fields->writer, &RecordWriterType)) {
            PyErr_SetString(PyExc_TypeError, "a batch's writer is a RecordWriter");
            goto next;
        }
        RecordWriter *writer = (RecordWriter *)fields->writer;
        PyObject *payload = writer->payload;
        if (payload == NULL || payload == Py_None) {
            PyErr_SetString(PyExc_ValueError, "a batch in a request is closed (sealed) first");
            goto next;
        }
        long long producer_id = -1, epoch = -1, sequence = -1;
        if (sequenced) {
            if (((producer_id = ranged_field(fields->producer_id, INT64_MIN, INT64_MAX,
                                             "producer_id")) == -1 && PyErr_Occurred()) ||
                ((epoch = ranged_field(fields->producer_epoch, -32768, 32767,
                                       "producer_epoch")) == -1 && PyErr_Occurred()) ||
                ((sequence = ranged_field(fields->base_sequence, INT32_MIN, INT32_MAX,
                                          "base_sequence")) == -1 && PyErr_Occurred()))
                goto next;
        }
        Py_INCREF(payload);
        header = batch_header(writer, payload,
                              transactional ? writer->codec | TRANSACTIONAL_BIT : writer->codec,
                              producer_id, epoch, sequence);
        Py_ssize_t length = header == NULL ? -1 : PyObject_Length(payload);
        if (length >= 0)
            records = PyTuple_Pack(2, header, payload);
        Py_DECREF(payload);
        if (records == NULL)
            goto next;
        size += BATCH_HEADER_SIZE + length;
        if (!PyObject_IS_GC(PyTuple_GET_ITEM(records, 1)))
            PyObject_GC_UnTrack(records);  /* (bytes, SealedRecords: see plain_dict) */
        PyObject *pairs[4] = {s_index, fields->partition, s_records, records};
        if ((entry = plain_dict(pairs, 2)) == NULL)
            goto next;
        PyObject *listed = PyDict_GetItemWithError(by_topic, fields->topic);
        if (listed == NULL) {
            if (PyErr_Occurred() || (listed = PyList_New(0)) == NULL)
                goto next;
            int stored = PyDict_SetItem(by_topic, fields->topic, listed);
            Py_DECREF(listed);  /* (held by by_topic) */
            if (stored < 0)
                goto next;
        }
        ok = PyList_Append(listed, entry) == 0 && PyDict_SetItem(in_flight, batch, Py_None) == 0;
    next:
        Py_XDECREF(header);
        Py_XDECREF(records);
        Py_XDECREF(entry);
        Py_DECREF(batch);
        if (!ok)
            goto done;
    }
    if ((topic_data = PyList_New(0)) == NULL)
        goto done;
    PyObject *name, *partitions;
    Py_ssize_t at = 0;
    while (PyDict_Next(by_topic, &at, &name, &partitions)) {
        PyObject *pairs[4] = {s_name, name, s_partition_data, partitions};
        PyObject *topic = PyDict_New();
        int failed = topic == NULL || PyDict_SetItem(topic, pairs[0], pairs[1]) < 0 ||
            PyDict_SetItem(topic, pairs[2], pairs[3]) < 0 || PyList_Append(topic_data, topic) < 0;
        Py_XDECREF(topic);
        if (failed)
            goto done;
    }
    result = Py_BuildValue("(Onddd)", topic_data, size, earliest, waited, most);
done:
    Py_XDECREF(topic_data);
    Py_DECREF(by_topic);
    return result;
}

/* -- settle_produce: a Produce response's answers matched to the request's batches --------- */

/* dict[key] as a new reference; NULL with KeyError (or the lookup's error) if missing. */
static PyObject *
required(PyObject *dict, PyObject *key)
{
    if (!PyDict_Check(dict)) {
        PyErr_SetString(PyExc_TypeError, "a Produce response's answers are dicts");
        return NULL;
    }
    PyObject *value = PyDict_GetItemWithError(dict, key);
    if (value == NULL && !PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, key);
    return Py_XNewRef(value);
}

/* 1 if `batch` (a batch with its fields set) is answered in `answers` (by topic, then
   partition index) with error code 0; 0 if not, or it is no such batch; -1 on an error. */
static int
answered_ok(PyObject *answers, PyObject *batch)
{
    if (!is_batch(batch))
        return 0;
    BatchFields *fields = (BatchFields *)batch;
    if (fields->topic == NULL || fields->partition == NULL)
        return 0;
    PyObject *by_index = PyDict_GetItemWithError(answers, fields->topic);
    PyObject *answer = by_index == NULL ? NULL : PyDict_GetItemWithError(by_index, fields->partition);
    if (answer == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *code = required(answer, s_error_code);
    if (code == NULL)
        return -1;
    int ok = PyLong_CheckExact(code) && PyLong_AsLong(code) == 0;
    Py_DECREF(code);
    return ok;
}

/* settle_produce(batches, responses, in_flight, run_watchers, all_or_none): see
   _py.settle_produce. At 10,000 partitions a response answers ~490 batches. */
static PyObject *
py_settle_produce(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 5, "settle_produce(batches, responses, in_flight, run_watchers, "
                    "all_or_none)"))
        return NULL;
    PyObject *batches = args[0], *responses = args[1], *in_flight = args[2];
    int all_or_none = PyObject_IsTrue(args[4]), complete = 1;
    if (all_or_none < 0)
        return NULL;
    if (!PyList_CheckExact(batches) || !PyList_Check(responses) || !PyDict_CheckExact(in_flight)) {
        PyErr_SetString(PyExc_TypeError, "settle_produce takes a list of batches, a list of "
                        "topics' answers and a dict");
        return NULL;
    }
    PyObject *answers = PyDict_New(), *acked = PyList_New(0), *rest = PyList_New(0),
        *woken = PyList_New(0), *result = NULL;
    if (answers == NULL || acked == NULL || rest == NULL || woken == NULL)
        goto done;
    /* Each topic's answers by partition index. */
    for (Py_ssize_t t = 0; t < PyList_GET_SIZE(responses); t++) {
        PyObject *topic = Py_NewRef(PyList_GET_ITEM(responses, t));
        PyObject *name = required(topic, s_name);
        PyObject *partitions = name == NULL ? NULL : required(topic, s_partition_responses);
        Py_DECREF(topic);
        PyObject *by_index = NULL;
        int failed = partitions == NULL;
        if (!failed && !PyList_Check(partitions)) {
            PyErr_SetString(PyExc_TypeError, "a topic's answers are a list");
            failed = 1;
        }
        if (!failed) {
            by_index = PyDict_GetItemWithError(answers, name);
            if (by_index != NULL)
                Py_INCREF(by_index);
            else if (PyErr_Occurred() || (by_index = PyDict_New()) == NULL ||
                     PyDict_SetItem(answers, name, by_index) < 0)
                failed = 1;
        }
        for (Py_ssize_t i = 0; !failed && i < PyList_GET_SIZE(partitions); i++) {
            PyObject *answer = Py_NewRef(PyList_GET_ITEM(partitions, i));
            PyObject *index = required(answer, s_index);
            failed = index == NULL || PyDict_SetItem(by_index, index, answer) < 0;
            Py_XDECREF(index);
            Py_DECREF(answer);
        }
        Py_XDECREF(by_index);
        Py_XDECREF(partitions);
        Py_XDECREF(name);
        if (failed)
            goto done;
    }
    for (Py_ssize_t i = 0; all_or_none && complete && i < PyList_GET_SIZE(batches); i++) {
        PyObject *batch = Py_NewRef(PyList_GET_ITEM(batches, i));
        int ok = answered_ok(answers, batch);
        Py_DECREF(batch);
        if (ok < 0)
            goto done;
        complete = ok;  /* one not answered fine: none completed here */
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batches); i++) {
        PyObject *batch = Py_NewRef(PyList_GET_ITEM(batches, i));
        PyObject *answer = NULL, *code = NULL, *base = NULL, *time = NULL;
        int failed = 1;
        if (!is_batch(batch)) {
            PyErr_SetString(PyExc_TypeError, "settle_produce takes a list of batches");
            goto next;
        }
        BatchFields *fields = (BatchFields *)batch;
        if (fields->topic == NULL || fields->partition == NULL) {
            PyErr_SetString(PyExc_AttributeError, "the batch's fields are not set");
            goto next;
        }
        PyObject *by_index = PyDict_GetItemWithError(answers, fields->topic);
        if (by_index != NULL)
            answer = Py_XNewRef(PyDict_GetItemWithError(by_index, fields->partition));
        if (PyErr_Occurred())
            goto next;
        int fine = 0;
        if (answer != NULL && complete) {
            if ((code = required(answer, s_error_code)) == NULL)
                goto next;
            fine = PyLong_CheckExact(code) && PyLong_AsLong(code) == 0;
        }
        if (!fine) {
            PyObject *pair = PyTuple_Pack(2, batch, answer != NULL ? answer : Py_None);
            failed = pair == NULL || PyList_Append(rest, pair) < 0;
            Py_XDECREF(pair);
            goto next;
        }
        if ((base = required(answer, s_base_offset)) == NULL ||
            (time = required(answer, s_log_append_time_ms)) == NULL)
            goto next;
        PyObject *left = PyDict_GetItemWithError(in_flight, batch);  /* in_flight.pop(batch) */
        if ((left == NULL && PyErr_Occurred()) ||
            (left != NULL && PyDict_DelItem(in_flight, batch) < 0))
            goto next;
        failed = batch_complete(fields, base, time, woken) < 0 || PyList_Append(acked, batch) < 0;
    next:
        Py_XDECREF(answer);
        Py_XDECREF(code);
        Py_XDECREF(base);
        Py_XDECREF(time);
        Py_DECREF(batch);
        if (failed)
            goto done;
    }
    if (PyList_GET_SIZE(woken)) {  /* their records' callbacks, in one loop callback */
        PyObject *first = (PyObject *)PyList_GET_ITEM(woken, 0);
        PyObject *loop = PyObject_CallMethodNoArgs(((BatchFields *)first)->future, s_get_loop);
        PyObject *handle = loop == NULL ? NULL
            : PyObject_CallMethodObjArgs(loop, s_call_soon, args[3], woken, NULL);
        Py_XDECREF(loop);
        if (handle == NULL)
            goto done;
        Py_DECREF(handle);
    }
    result = PyTuple_Pack(2, acked, rest);
done:
    Py_XDECREF(answers);
    Py_XDECREF(acked);
    Py_XDECREF(rest);
    Py_XDECREF(woken);
    return result;
}

/* -- take_acked, count_acked: a response's acknowledged batches counted ------------------ */

/* The batch's writer as a RecordWriter, or NULL with TypeError. */
static RecordWriter *
writer_of(PyObject *batch)
{
    if (!is_batch(batch) || ((BatchFields *)batch)->writer == NULL ||
        !PyObject_TypeCheck(((BatchFields *)batch)->writer, &RecordWriterType)) {
        PyErr_SetString(PyExc_TypeError, "takes a list of batches (with their writers)");
        return NULL;
    }
    return (RecordWriter *)((BatchFields *)batch)->writer;
}

/* take_acked(batches, incomplete): see _py.take_acked. */
static PyObject *
py_take_acked(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 2, "take_acked(batches, incomplete)"))
        return NULL;
    PyObject *batches = args[0], *incomplete = args[1];
    if (!PyList_CheckExact(batches) || !PySet_Check(incomplete)) {
        PyErr_SetString(PyExc_TypeError, "take_acked takes a list of batches and a set");
        return NULL;
    }
    PyObject *counted = PyList_New(0);
    Py_ssize_t freed = 0, records = 0;
    long long newest = 0;
    for (Py_ssize_t i = 0; counted != NULL && i < PyList_GET_SIZE(batches); i++) {
        PyObject *batch = Py_NewRef(PyList_GET_ITEM(batches, i));
        RecordWriter *writer = writer_of(batch);
        int in = writer == NULL ? -1 : PySet_Discard(incomplete, batch);
        if (in > 0) {  /* (else it had its outcome already: expired in flight) */
            PyObject *number = ((BatchFields *)batch)->number;
            long long first = number != NULL && PyTuple_Check(number) && PyTuple_GET_SIZE(number)
                ? as_long_long(PyTuple_GET_ITEM(number, 0)) : -1;
            if (first == -1 && PyErr_Occurred())
                in = -1;
            freed += writer->reserved;
            records += writer->count;
            if (first > newest)
                newest = first;
            if (in > 0 && PyList_Append(counted, batch) < 0)
                in = -1;
        }
        Py_DECREF(batch);
        if (in < 0)
            Py_CLEAR(counted);
    }
    if (counted == NULL)
        return NULL;
    PyObject *result = Py_BuildValue("(OnnL)", counted, freed, records, newest);
    Py_DECREF(counted);
    return result;
}

/* count_acked(batches, now, bounds, buckets): see _py.count_acked. */
static PyObject *
py_count_acked(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 4, "count_acked(batches, now, bounds, buckets)"))
        return NULL;
    PyObject *batches = args[0], *bounds = args[2], *buckets = args[3];
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    if (!PyList_CheckExact(batches) || !PyTuple_Check(bounds) || !PyList_Check(buckets) ||
        PyList_GET_SIZE(buckets) != PyTuple_GET_SIZE(bounds) + 1 || PyTuple_GET_SIZE(bounds) > 64) {
        PyErr_SetString(PyExc_TypeError, "count_acked takes a list of batches, a tuple of at "
                        "most 64 bounds and a list of one bucket more");
        return NULL;
    }
    double limits[64];
    Py_ssize_t edges = PyTuple_GET_SIZE(bounds);
    for (Py_ssize_t k = 0; k < edges; k++)
        if ((limits[k] = PyFloat_AsDouble(PyTuple_GET_ITEM(bounds, k))) == -1.0 && PyErr_Occurred())
            return NULL;
    Py_ssize_t *hits = PyMem_Calloc(edges + 1, sizeof(Py_ssize_t));
    PyObject *by_topic = PyDict_New(), *result = NULL;
    double total = 0.0;
    if (hits == NULL || by_topic == NULL) {
        if (hits == NULL)
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batches); i++) {
        PyObject *batch = PyList_GET_ITEM(batches, i);  /* (nothing here runs Python) */
        RecordWriter *writer = writer_of(batch);
        BatchFields *fields = (BatchFields *)batch;
        if (writer == NULL)
            goto done;
        if (fields->topic == NULL || fields->created == NULL) {
            PyErr_SetString(PyExc_AttributeError, "the batch's fields are not set");
            goto done;
        }
        double created = PyFloat_AsDouble(fields->created);
        if (created == -1.0 && PyErr_Occurred())
            goto done;
        PyObject *counts = PyDict_GetItemWithError(by_topic, fields->topic);
        if (counts == NULL) {
            if (PyErr_Occurred() || (counts = Py_BuildValue("[iii]", 0, 0, 0)) == NULL)
                goto done;
            int stored = PyDict_SetItem(by_topic, fields->topic, counts);
            Py_DECREF(counts);  /* (held by by_topic) */
            if (stored < 0)
                goto done;
        }
        Py_ssize_t add[3] = {writer->count, 1, writer->size};
        for (int k = 0; k < 3; k++) {
            Py_ssize_t was = PyLong_AsSsize_t(PyList_GET_ITEM(counts, k));
            PyObject *sum = was == -1 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(was + add[k]);
            if (sum == NULL)
                goto done;
            PyList_SetItem(counts, k, sum);
        }
        double latency = now - created;
        Py_ssize_t low = 0, high = edges;  /* bisect_left */
        while (low < high) {
            Py_ssize_t mid = (low + high) / 2;
            if (limits[mid] < latency)
                low = mid + 1;
            else
                high = mid;
        }
        hits[low]++;
        total += latency;
    }
    for (Py_ssize_t k = 0; k <= edges; k++) {
        if (!hits[k])
            continue;
        Py_ssize_t was = PyLong_AsSsize_t(PyList_GET_ITEM(buckets, k));
        PyObject *sum = was == -1 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(was + hits[k]);
        if (sum == NULL || PyList_SetItem(buckets, k, sum) < 0)
            goto done;
    }
    result = Py_BuildValue("(Od)", by_topic, total);
done:
    PyMem_Free(hits);
    Py_XDECREF(by_topic);
    return result;
}

/* The accumulator's fields (see AccumulatorFields below): here for the Appender, which reads
   `line` and `appendable` from them. */
typedef struct {
    PyObject_HEAD
    PyObject *line, *pool, *loop, *batches, *appendable, *incomplete, *txn, *lone_acked_at,
        *wake_sender, *wake_sender_for, *touched, *batch_type, *writer_type, *drained_bytes,
        *codec, *compression_level;
    Py_ssize_t batch_size, first_reserve, max_request_size, buffer_memory, batches_created,
        lone_in_a_row;
    double linger, delivery_timeout, quiet_until, expiry_floor, round_by;
    char closing, said_linger_bound;
} AccumulatorFields;

#define ACCUMULATOR_OBJECT_COUNT 16  /* the PyObject pointers above, in order from `line` */

static PyTypeObject AccumulatorFieldsType;

/* -- Appender: enqueue()'s and send()'s common case in one call ------------------------------

   `producer.enqueue(topic, value, key)` and `producer.send(...)` are this object's call in a
   started producer: every check of the intake's append() (state, thread, loop, transaction,
   topic metadata, types, timestamp, partition) and the append itself, with no Python frame.
   Anything uncommon (a keyword it does not know, headers, serializers, a topic without
   metadata, a record that needs a new batch or waits for memory, and every error) goes to
   `later`, the Python path, with the very same arguments: it checks everything again and
   raises what it raises, so only the common case is here. send() gets the future itself;
   enqueue() gets it in a Ready, an awaitable that is already complete (no coroutine per
   record). _py.Appender is the same in Python. */

static PyObject *s_state, *s_thread, *s_loop_running, *s_topics, *s_leaders, *s_line,
    *s_appendable, *s_key, *s_timestamp_ms, *s_headers;  /* interned at import */

/* What enqueue() returns for a record it appended at once: awaiting it gives the record's
   future with no frame and no loop turn. A coroutine to asyncio (send, throw and close), so
   create_task(), TaskGroups and gather() take it as they take an `async def` call. */
typedef struct {
    PyObject_HEAD
    PyObject *result;
} Ready;

static PyTypeObject ReadyType;

/* A Ready of `result` (a new reference, taken). */
static PyObject *
make_ready(PyObject *result)
{
    Ready *self = PyObject_GC_New(Ready, &ReadyType);
    if (self == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    self->result = result;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyObject *
ready_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *result;
    if ((kwargs != NULL && PyDict_GET_SIZE(kwargs)) ||
        !PyArg_UnpackTuple(args, "Ready", 1, 1, &result)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Ready(result)");
        return NULL;
    }
    return make_ready(Py_NewRef(result));
}

static int
ready_traverse(Ready *self, visitproc visit, void *arg)
{
    Py_VISIT(self->result);
    return 0;
}

static int
ready_clear(Ready *self)
{
    Py_CLEAR(self->result);
    return 0;
}

static void
ready_dealloc(Ready *self)
{
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->result);
    PyObject_GC_Del(self);
}

static PyObject *
ready_self(PyObject *self)
{
    return Py_NewRef(self);
}

/* `await ready`: the result at once, as a returning coroutine gives it (no exception). */
static PySendResult
ready_am_send(Ready *self, PyObject *arg, PyObject **result)
{
    *result = Py_NewRef(self->result == NULL ? Py_None : self->result);
    return PYGEN_RETURN;
}

/* A step as a generator takes it (create_task(), `yield from`): StopIteration(result). */
static PyObject *
ready_next(Ready *self)
{
    PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration,
                                         self->result == NULL ? Py_None : self->result);
    if (stop != NULL) {
        PyErr_SetObject(PyExc_StopIteration, stop);
        Py_DECREF(stop);
    }
    return NULL;
}

static PyObject *
ready_send(Ready *self, PyObject *value)
{
    return ready_next(self);
}

/* throw(exc) or throw(type[, value[, traceback]]): raised as given (nothing to clean up). */
static PyObject *
ready_throw(Ready *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw(exception[, value[, traceback]])");
        return NULL;
    }
    PyObject *type = args[0], *value = nargs > 1 ? args[1] : Py_None;
    if (PyExceptionInstance_Check(type))
        PyErr_SetObject((PyObject *)Py_TYPE(type), type);
    else if (!PyExceptionClass_Check(type))
        PyErr_SetString(PyExc_TypeError, "exceptions must be classes or instances deriving "
                        "from BaseException");
    else if (PyExceptionInstance_Check(value))
        PyErr_SetObject((PyObject *)Py_TYPE(value), value);
    else
        PyErr_SetObject(type, value);
    return NULL;
}

static PyObject *
ready_close(PyObject *self, PyObject *unused)
{
    Py_RETURN_NONE;
}

static PyMethodDef ready_methods[] = {
    {"send", (PyCFunction)ready_send, METH_O,
     "One step as a coroutine: StopIteration with the result."},
    {"throw", (PyCFunction)(void (*)(void))ready_throw, METH_FASTCALL,
     "Raise the exception given (nothing to clean up)."},
    {"close", ready_close, METH_NOARGS, "Nothing to stop."},
    {NULL}
};

static PyAsyncMethods ready_async = {
    .am_await = ready_self,
    .am_send = (sendfunc)ready_am_send,
};

static PyTypeObject ReadyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioproducer._speedups._c.Ready",
    .tp_doc = "Ready(result): an awaitable that is complete, and a coroutine to asyncio.",
    .tp_basicsize = sizeof(Ready),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = ready_new,
    .tp_dealloc = (destructor)ready_dealloc,
    .tp_traverse = (traverseproc)ready_traverse,
    .tp_clear = (inquiry)ready_clear,
    .tp_as_async = &ready_async,
    .tp_iter = ready_self,
    .tp_iternext = (iternextfunc)ready_next,
    .tp_methods = ready_methods,
};

typedef struct {
    PyObject_HEAD
    PyObject *later;        /* the Python path, called with the same arguments */
    PyObject *future_type;  /* what append_record makes: RecordFuture, Sending */
    PyObject *lifecycle, *started, *clock;  /* the producer's Lifecycle, STARTED, time.time */
    int ready;              /* the future in a Ready (enqueue), or bare (send) */
    int python_only;        /* serializers or a custom partitioner: always `later` */
    int partition_in_python;  /* a record without a partition goes to `later` */
    /* From attach(): the Cluster, the RecordAccumulator, the transaction's check_can_send
       (None if not transactional), the sticky partitioner's partition, and what opens a
       batch for a record whose partition has none (open_new). */
    PyObject *cluster, *accumulator, *check_can_send, *sticky, *open_new;
    vectorcallfunc vectorcall;
    PyObject *stamp;        /* the last timestamp made (an int of ms), or NULL */
    long long stamp_ms;     /* its value */
} Appender;

static PyTypeObject AppenderType;

static int
appender_traverse(Appender *self, visitproc visit, void *arg)
{
    Py_VISIT(self->later);
    Py_VISIT(self->future_type);
    Py_VISIT(self->lifecycle);
    Py_VISIT(self->started);
    Py_VISIT(self->clock);
    Py_VISIT(self->cluster);
    Py_VISIT(self->accumulator);
    Py_VISIT(self->check_can_send);
    Py_VISIT(self->sticky);
    Py_VISIT(self->open_new);
    return 0;
}

static int
appender_clear(Appender *self)
{
    Py_CLEAR(self->later);
    Py_CLEAR(self->future_type);
    Py_CLEAR(self->lifecycle);
    Py_CLEAR(self->started);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->cluster);
    Py_CLEAR(self->accumulator);
    Py_CLEAR(self->check_can_send);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->open_new);
    Py_CLEAR(self->stamp);
    return 0;
}

static void
appender_dealloc(Appender *self)
{
    PyObject_GC_UnTrack(self);
    appender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Whether `name` (a keyword given) is `known` (interned: almost always the same object). */
static inline int
is_name(PyObject *name, PyObject *known)
{
    return name == known || (PyUnicode_Check(name) && PyUnicode_Compare(name, known) == 0);
}

/* A given timestamp above 0 and below this many ms (1973-03-03) is likely in seconds:
   `later` (the intake) warns of it once (_py.SECONDS_LIKE_BELOW). */
#define SECONDS_LIKE_BELOW 100000000000LL

/* An int-like given as a partition or timestamp (numpy's and pandas' integers: nb_index) as
   the int it stands for, a new reference; NULL without an error set for anything else (a
   bool included), which `later` refuses. (arguments.as_int is its twin on the Python path.) */
static PyObject *
as_index(PyObject *number)
{
    PyNumberMethods *methods = Py_TYPE(number)->tp_as_number;
    if (PyBool_Check(number) || methods == NULL || methods->nb_index == NULL)
        return NULL;
    PyObject *index = PyNumber_Index(number);
    if (index == NULL && PyErr_ExceptionMatches(PyExc_Exception))
        PyErr_Clear();  /* `later` refuses it */
    return index;
}

static PyObject *s_kept_batch;  /* (interned at import, with the others below) */

/* Whether the error set was raised by an opening with its batch queued (its _wake_failed
   raised: see _py.KEPT_BATCH): the record is buffered, and taken again it would be sent
   twice. */
static int
raised_with_kept_batch(void)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    PyObject *dict = value == NULL ? NULL : PyObject_GenericGetDict(value, NULL);
    int kept = dict != NULL && PyDict_GetItemWithError(dict, s_kept_batch) != NULL;
    Py_XDECREF(dict);
    PyErr_Clear();  /* (a failed lookup: not kept) */
    PyErr_Restore(type, value, traceback);
    return kept;
}

/* int(ms), ms being time.time() * 1000: the last one made if it is the same millisecond (a
   new int each record was ~140 instructions, and its records' futures now share one). */
static PyObject *
stamp_of(Appender *self, double ms)
{
    if (!(ms >= 0.0 && ms < 9e15))  /* (beyond: not exactly a double's, or not a time) */
        return PyLong_FromDouble(ms);
    long long whole = (long long)ms;
    if (self->stamp != NULL && self->stamp_ms == whole)
        return Py_NewRef(self->stamp);
    PyObject *stamp = PyLong_FromLongLong(whole);
    if (stamp != NULL) {
        Py_XSETREF(self->stamp, Py_NewRef(stamp));
        self->stamp_ms = whole;
    }
    return stamp;
}

/* The common case: the appended record's future (in a Ready for enqueue), or NULL: with an
   error set, that error; without, "not the common case: ask `later`". No Python code with
   side effects runs before the append but the transaction's check, the sticky
   partitioner's choice and an int-like's __index__, which `later` asks again and gets the
   same answer. A keyed record (or one given its partition) whose partition has no open
   batch gets one from open_new, which opens it if the memory is free and returns it (else
   None, having done nothing; an Exception it raises, it raised having queued nothing and
   given the memory back: then `later` does it all, and raises what open_new raised; but
   one raised with its batch queued, which is raised).
   At many partitions a batch is opened every record or two (one record a batch when the
   producer yields to the loop often), and `later` (a coroutine, and the intake's checks
   again) cost ~10 us each. */
static PyObject *
appender_fast(Appender *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 2 || nargs > 3 || self->cluster == NULL || self->python_only)
        return NULL;
    PyObject *topic = args[0], *value = args[1], *key = nargs > 2 ? args[2] : NULL;
    PyObject *partition = Py_None, *timestamp = Py_None;
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < keywords; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *given = args[nargs + i];
        if (key == NULL && is_name(name, s_key))
            key = given;
        else if (is_name(name, s_partition))
            partition = given;
        else if (is_name(name, s_timestamp_ms))
            timestamp = given;
        else if (!(given == Py_None && is_name(name, s_headers)))
            return NULL;  /* headers, or what `later` refuses */
    }
    if (key == NULL)
        key = Py_None;
    if (!PyUnicode_CheckExact(topic) ||
        (key != Py_None && !PyBytes_CheckExact(key)) ||
        (value != Py_None && !PyBytes_CheckExact(value)))
        return NULL;

    /* The lifecycle: started, and called from its loop's thread with the loop running. */
    static SlotCache state_slot, thread_slot, loop_running_slot, leaders_slot;
    PyObject *got = read_slot(&state_slot, self->lifecycle, s_state);
    if (got == NULL)
        return NULL;
    int started = got == self->started;
    Py_DECREF(got);
    if (!started)
        return NULL;
    if ((got = read_slot(&thread_slot, self->lifecycle, s_thread)) == NULL)
        return NULL;
    int here = PyLong_CheckExact(got) &&
        PyLong_AsUnsignedLong(got) == PyThread_get_thread_ident();
    Py_DECREF(got);
    if (PyErr_Occurred())
        PyErr_Clear();
    if (!here)
        return NULL;
    if ((got = read_slot(&loop_running_slot, self->lifecycle, s_loop_running)) == NULL)
        return NULL;
    PyObject *running = PyObject_CallNoArgs(got);
    Py_DECREF(got);
    if (running == NULL)
        return NULL;
    int is_running = running == Py_True;
    Py_DECREF(running);
    if (!is_running)
        return NULL;
    if (self->check_can_send != Py_None) {
        PyObject *can = PyObject_CallNoArgs(self->check_can_send);
        if (can == NULL) {
            if (PyErr_ExceptionMatches(PyExc_Exception))
                PyErr_Clear();  /* `later` raises it */
            return NULL;
        }
        Py_DECREF(can);
    }

    /* The topic's leaders. */
    static SlotCache topics_slot;
    PyObject *topics = read_slot(&topics_slot, self->cluster, s_topics);
    if (topics == NULL)
        return NULL;
    PyObject *info = PyDict_CheckExact(topics) ? PyDict_GetItemWithError(topics, topic) : NULL;
    Py_XINCREF(info);
    Py_DECREF(topics);
    if (info == NULL)
        return NULL;
    PyObject *leaders = read_slot(&leaders_slot, info, s_leaders);
    Py_DECREF(info);
    if (leaders == NULL)
        return NULL;
    Py_ssize_t count = PyTuple_CheckExact(leaders) ? PyTuple_GET_SIZE(leaders) : 0;
    PyObject *stamp = NULL, *chosen = NULL, *open = NULL, *future = NULL;
    int sticky = 0;
    if (count == 0)
        goto done;

    /* The timestamp: now (as int(time.time() * 1000)), or one given in Kafka's int64. */
    if (timestamp == Py_None) {
        PyObject *now = PyObject_CallNoArgs(self->clock);
        if (now == NULL)
            goto done;
        double seconds = PyFloat_AsDouble(now);
        Py_DECREF(now);
        if (seconds == -1.0 && PyErr_Occurred())
            goto done;
        if ((stamp = stamp_of(self, seconds * 1000.0)) == NULL)
            goto done;
    }
    else {
        if (PyLong_CheckExact(timestamp))
            stamp = Py_NewRef(timestamp);
        else if ((stamp = as_index(timestamp)) == NULL)
            goto done;
        int overflow = 0;
        long long given = PyLong_AsLongLongAndOverflow(stamp, &overflow);
        if (given < 0 || overflow || (given > 0 && given < SECONDS_LIKE_BELOW))
            goto done;  /* (`later` refuses it, or warns of a time in seconds) */
    }

    /* The partition: given, by murmur2 of the key, or the topic's sticky one. */
    if (partition != Py_None) {
        if (PyLong_CheckExact(partition))
            chosen = Py_NewRef(partition);
        else if ((chosen = as_index(partition)) == NULL)
            goto done;
        Py_ssize_t p = PyLong_AsSsize_t(chosen);
        if (p == -1 && PyErr_Occurred())
            PyErr_Clear();
        if (p < 0 || p >= count)
            goto done;
    }
    else if (self->partition_in_python)
        goto done;
    else if (key != Py_None) {
        chosen = PyLong_FromSsize_t(partition_of(
            (const unsigned char *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), count));
        if (chosen == NULL)
            goto done;
    }
    else {
        PyObject *call[2] = {topic, leaders};
        if ((chosen = PyObject_Vectorcall(self->sticky, call, 2, NULL)) == NULL)
            goto done;
        sticky = 1;  /* (a new batch may move it on: `later`'s work) */
    }

    /* Into the partition's open batch, unless records wait in line for memory. (The
       accumulator's fields read where they lie: two lookups a record by name were 5% of
       the instructions of an enqueue() loop.) */
    int fields = PyObject_TypeCheck(self->accumulator, &AccumulatorFieldsType);
    PyObject *line = fields ? Py_XNewRef(((AccumulatorFields *)self->accumulator)->line)
        : PyObject_GetAttr(self->accumulator, s_line);
    if (line == NULL)
        goto done;
    int queued = PyObject_IsTrue(line);
    Py_DECREF(line);
    if (queued != 0)
        goto done;
    PyObject *appendable = fields ? Py_XNewRef(((AccumulatorFields *)self->accumulator)->appendable)
        : PyObject_GetAttr(self->accumulator, s_appendable);
    if (appendable == NULL)
        goto done;
    open = PyDict_CheckExact(appendable) ? PyDict_GetItemWithError(appendable, topic) : NULL;
    Py_XINCREF(open);
    Py_DECREF(appendable);
    if (open == NULL || !PyTuple_CheckExact(open) || PyTuple_GET_SIZE(open) != 2)
        goto done;
    PyObject *append[8] = {PyTuple_GET_ITEM(open, 0), PyTuple_GET_ITEM(open, 1), chosen, stamp,
                           key, value, Py_None, self->future_type};
    future = py_append_record(NULL, append, 8);
    if (future == Py_None) {
        Py_CLEAR(future);  /* no open batch, or no room in it */
        PyObject *writers = PyTuple_GET_ITEM(open, 1);
        Py_ssize_t p = PyLong_AsSsize_t(chosen);
        if (p == -1 && PyErr_Occurred())
            goto done;
        if (sticky || self->open_new == NULL || self->open_new == Py_None ||
            !PyList_CheckExact(writers) || p < 0 || p >= PyList_GET_SIZE(writers) ||
            PyList_GET_ITEM(writers, p) != Py_None)
            goto done;  /* a full batch to close first, or no opener: `later` */
        PyObject *partitions = PyLong_FromSsize_t(count);
        if (partitions == NULL)
            goto done;
        PyObject *call[6] = {topic, chosen, key, value, stamp, partitions};
        PyObject *batch = PyObject_Vectorcall(self->open_new, call, 6, NULL);
        Py_DECREF(partitions);
        if (batch == NULL) {
            if (PyErr_ExceptionMatches(PyExc_Exception) && !raised_with_kept_batch())
                PyErr_Clear();  /* `later` raises it */
            goto done;
        }
        if (batch == Py_None) {
            Py_DECREF(batch);
            goto done;
        }
        PyObject *first = PyLong_FromLong(0);  /* the batch's first record */
        future = first == NULL ? NULL
            : make_fields((PyTypeObject *)self->future_type, batch, first, stamp);
        Py_XDECREF(first);
        Py_DECREF(batch);
    }
    if (future != NULL && self->ready)
        future = make_ready(future);
done:
    Py_XDECREF(open);
    Py_XDECREF(chosen);
    Py_XDECREF(stamp);
    Py_DECREF(leaders);
    return future;
}

static PyObject *
appender_vectorcall(Appender *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *done = appender_fast(self, args, PyVectorcall_NARGS(nargsf), kwnames);
    if (done != NULL || PyErr_Occurred())
        return done;
    return PyObject_Vectorcall(self->later, args, nargsf, kwnames);
}

static PyObject *
appender_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *later, *future_type, *lifecycle, *started, *clock;
    int ready, python_only, partition_in_python;
    static char *names[] = {"later", "future_type", "ready", "lifecycle", "started", "clock",
                            "python_only", "partition_in_python", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOpOOOpp:Appender", names, &later,
                                     &future_type, &ready, &lifecycle, &started, &clock,
                                     &python_only, &partition_in_python))
        return NULL;
    if (!PyType_Check(future_type) ||
        !PyType_IsSubtype((PyTypeObject *)future_type, &RecordFieldsType)) {
        PyErr_SetString(PyExc_TypeError, "Appender makes RecordFields subclasses");
        return NULL;
    }
    Appender *self = (Appender *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->later = Py_NewRef(later);
    self->future_type = Py_NewRef(future_type);
    self->lifecycle = Py_NewRef(lifecycle);
    self->started = Py_NewRef(started);
    self->clock = Py_NewRef(clock);
    self->ready = ready;
    self->python_only = python_only;
    self->partition_in_python = partition_in_python;
    self->vectorcall = (vectorcallfunc)appender_vectorcall;
    return (PyObject *)self;
}

static PyObject *
appender_attach(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 5, "attach(cluster, accumulator, check_can_send, sticky, "
                    "open_new)"))
        return NULL;
    Py_XSETREF(self->cluster, Py_NewRef(args[0]));
    Py_XSETREF(self->accumulator, Py_NewRef(args[1]));
    Py_XSETREF(self->check_can_send, Py_NewRef(args[2]));
    Py_XSETREF(self->sticky, Py_NewRef(args[3]));
    Py_XSETREF(self->open_new, Py_NewRef(args[4]));
    Py_RETURN_NONE;
}

static PyMethodDef appender_methods[] = {
    {"attach", (PyCFunction)(void (*)(void))appender_attach, METH_FASTCALL,
     "attach(cluster, accumulator, check_can_send, sticky, open_new): the parts a started\n"
     "producer has (check_can_send None unless transactional; sticky: the sticky\n"
     "partitioner's partition(topic, leaders); open_new(topic, partition, key, value,\n"
     "timestamp, partitions): a new batch holding the record, or None, or None itself).\n"
     "Until then every call goes to `later`."},
    {NULL}
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioproducer._speedups._c.Appender",
    .tp_doc = "Appender(later, future_type, ready, lifecycle, started, clock, python_only,\n"
              "         partition_in_python)\n\n"
              "Called as enqueue() or send() is: appends a record in the common case (its\n"
              "partition's open batch, or a new one from open_new where none is open) and\n"
              "returns its future (in a Ready if `ready`); else returns later(*args, **kwargs).",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Appender, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = appender_new,
    .tp_dealloc = (destructor)appender_dealloc,
    .tp_traverse = (traverseproc)appender_traverse,
    .tp_clear = (inquiry)appender_clear,
    .tp_methods = appender_methods,
};

/* producer.send and producer.enqueue (Appenders) are coroutine functions to inspect and
   asyncio, as what a call returns is awaited: the attributes that say so (see _marks.py) as
   class attributes, nothing per call. */
static int
mark_coroutine_function(PyTypeObject *type)
{
    PyObject *marks_module = PyImport_ImportModule("aioproducer._speedups._marks");
    if (marks_module == NULL)
        return -1;
    PyObject *marks = PyObject_GetAttrString(marks_module, "COROUTINE_MARKS");
    Py_DECREF(marks_module);
    if (marks == NULL)
        return -1;
    int updated = PyDict_Update(type->tp_dict, marks);
    Py_DECREF(marks);
    if (updated < 0)
        return -1;
    PyType_Modified(type);
    return 0;
}

/* -- AccumulatorFields: opening a batch ---------------------------------------------------- */

/* The accumulator's state that opening a batch reads and writes (its members, which the
   RecordAccumulator, a subclass, sets and uses by the same names), and the opening in one
   call: at 10,000 partitions a batch is opened every record or two, and the Python path
   (the intake's open_new, open_batch, the writer's and the batch's constructors, the
   memory's checks: ~10 frames) was a fifth of the producer's CPU there. _py.AccumulatorFields
   is the same in Python. */


/* What a batch holding one record takes on the wire at most beyond its key, value and
   headers (protocol.records.record_size_upper_bound, which this mirrors). */
#define RECORD_MOST (BATCH_HEADER_SIZE + 5 + 1 + 10 + 5 + 5 + 5 + 1)

static PyObject *deque_type;  /* collections.deque */
static PyObject *s_time, *s_create_future, *s_append, *s_add, *s_is_transactional,
    *s_add_partition, *s_open_batches, *s_count_linger_bound, *s_wake_failed, *s_popleft, *s_close,
    *s_kept_batch, *s_drain_view, *s_discard, *s_has_producer_id, *s_error;  /* interned at import */

static int
accumulator_traverse(AccumulatorFields *self, visitproc visit, void *arg)
{
    PyObject **fields = &self->line;
    for (int i = 0; i < ACCUMULATOR_OBJECT_COUNT; i++)
        Py_VISIT(fields[i]);
    return 0;
}

static int
accumulator_clear(AccumulatorFields *self)
{
    PyObject **fields = &self->line;
    for (int i = 0; i < ACCUMULATOR_OBJECT_COUNT; i++)
        Py_CLEAR(fields[i]);
    return 0;
}

static void
accumulator_dealloc(AccumulatorFields *self)
{
    PyObject_GC_UnTrack(self);
    accumulator_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A new writer of `type` (RecordWriter or a subclass adding no field) drawing on `pool`. */
static PyObject *
writer_make(PyTypeObject *type, long long timestamp, Py_ssize_t limit, PyObject *pool,
            Py_ssize_t most)
{
    if (!PyType_IsSubtype(type, &RecordWriterType)) {
        PyErr_SetString(PyExc_TypeError, "the accumulator's writers are RecordWriters");
        return NULL;
    }
    RecordWriter *writer = (RecordWriter *)writer_new(type, NULL, NULL);
    if (writer == NULL)
        return NULL;
    writer->base_timestamp = writer->max_timestamp = timestamp;
    writer->size = BATCH_HEADER_SIZE;
    writer->limit = limit;
    writer->pool = (MemoryPool *)Py_NewRef(pool);
    writer->most = most;
    return (PyObject *)writer;
}

/* Take `batch` out of the incomplete set again (an opening undone before its batch was
   queued), keeping the error that undid it. */
static void
accumulator_unlist(AccumulatorFields *self, PyObject *batch)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (PySet_Check(self->incomplete)) {
        if (PySet_Discard(self->incomplete, batch) < 0)
            PyErr_Clear();
    }
    else {
        PyObject *gone = PyObject_CallMethodOneArg(self->incomplete, s_discard, batch);
        if (gone == NULL)
            PyErr_Clear();
        Py_XDECREF(gone);
    }
    PyErr_Restore(type, value, traceback);
}

/* Whether a batch just opened alone in its partition (`fresh`), holding `writer`, need not
   wake the sender (see _py.AccumulatorFields._lingers_unwoken): 1, 0, or -1 with an error. */
static int
accumulator_lingers_unwoken(AccumulatorFields *self, int fresh, PyObject *writer, double now)
{
    if (!fresh || self->round_by <= 0.0 || now + self->linger < self->round_by ||
        self->closing || ((RecordWriter *)writer)->size >= self->batch_size)
        return 0;
    int waiting = self->line == NULL ? 1 : PyObject_IsTrue(self->line);
    if (waiting != 0)
        return waiting < 0 ? -1 : 0;
    PyObject *txn = self->txn;
    if (txn == NULL || txn == Py_None)
        return 1;
    Py_INCREF(txn);
    PyObject *has = PyObject_GetAttr(txn, s_has_producer_id);
    int ready = has == NULL ? -1 : PyObject_IsTrue(has);
    Py_XDECREF(has);
    if (ready > 0) {
        PyObject *error = PyObject_GetAttr(txn, s_error);
        ready = error == NULL ? -1 : error == Py_None;
        Py_XDECREF(error);
    }
    Py_DECREF(txn);
    return ready;
}

/* The opening (see _py.AccumulatorFields._open): a new reference to the batch, or NULL.
   Every step that can fail comes before the batch is queued (then `reserved` goes back to
   the pool: the caller may take the record again), but the sender's wake, which needs it
   queued (at linger_ms=0 it may write it at once); what that raises goes to _wake_failed,
   or, not an Exception, is raised with the batch kept, named on it (_py.KEPT_BATCH). */
static PyObject *
accumulator_open(AccumulatorFields *self, PyObject *topic, PyObject *partition,
                 long long timestamp, PyObject *key, PyObject *value, PyObject *headers,
                 Py_ssize_t reserved, Py_ssize_t partitions, double now)
{
    if (self->pool == NULL || !PyObject_TypeCheck(self->pool, &MemoryPoolType)) {
        PyErr_SetString(PyExc_TypeError, "the accumulator's fields are not set (or not of "
                        "their types)");
        return NULL;
    }
    MemoryPool *pool = (MemoryPool *)Py_NewRef(self->pool);  /* (what `reserved` came from) */
    PyObject *batch = NULL, *writer = NULL, *future = NULL, *number = NULL, *created = NULL,
        *deadline = NULL, *held = NULL, *tp = NULL, *open = NULL, *queue = NULL, *wake = NULL;
    int fresh = 0, adding = 0;
    Py_ssize_t p = PyLong_AsSsize_t(partition);
    if (p == -1 && PyErr_Occurred())
        goto error;
    if (p < 0) {
        PyErr_SetString(PyExc_ValueError, "a partition is not negative");
        goto error;
    }
    if (self->batch_type == NULL || !PyType_Check(self->batch_type) ||
        !PyType_IsSubtype((PyTypeObject *)self->batch_type, &BatchFieldsType) ||
        self->writer_type == NULL || !PyType_Check(self->writer_type) ||
        self->loop == NULL || self->batches == NULL || !PyDict_CheckExact(self->batches) ||
        self->appendable == NULL || !PyDict_CheckExact(self->appendable) ||
        self->incomplete == NULL || self->wake_sender_for == NULL) {
        PyErr_SetString(PyExc_TypeError, "the accumulator's fields are not set (or not of "
                        "their types)");
        goto error;
    }
    if (!self->said_linger_bound) {
        if (self->lone_acked_at == NULL || self->lone_acked_at == Py_None)
            self->lone_in_a_row = 0;
        else {
            PyObject *stamp = PyFloat_FromDouble(now);
            PyObject *counted = stamp == NULL ? NULL
                : PyObject_CallMethodOneArg((PyObject *)self, s_count_linger_bound, stamp);
            Py_XDECREF(stamp);
            if (counted == NULL)
                goto error;
            Py_DECREF(counted);
        }
    }
    self->batches_created++;
    writer = writer_make((PyTypeObject *)self->writer_type, timestamp,
                         reserved < self->batch_size ? reserved : self->batch_size,
                         (PyObject *)pool, self->batch_size);
    if (writer == NULL)
        goto error;
    future = PyObject_CallMethodNoArgs(self->loop, s_create_future);
    number = future == NULL ? NULL : Py_BuildValue("(n)", self->batches_created);
    if (number != NULL)
        PyObject_GC_UnTrack(number);  /* (an int: never in a cycle) */
    created = number == NULL ? NULL : PyFloat_FromDouble(now);
    deadline = created == NULL ? NULL : PyFloat_FromDouble(now + self->delivery_timeout);
    held = deadline == NULL ? NULL : PyLong_FromSsize_t(reserved);
    if (held == NULL)
        goto error;
    batch = batch_fields_make((PyTypeObject *)self->batch_type, number, topic, partition,
                              writer, future, created, deadline, held);
    if (batch == NULL ||
        (((BatchFields *)batch)->loop = PyObject_CallMethodNoArgs(future, s_get_loop)) == NULL)
        goto error;
    batch_fields_pending_untrack(batch);
    OptionalBytes k, v, h;
    if (optional_bytes(key, &k) < 0)
        goto error;
    if (optional_bytes(value, &v) < 0) {
        release_optional(&k);
        goto error;
    }
    if (optional_bytes(headers, &h) < 0) {
        release_optional(&k);
        release_optional(&v);
        goto error;
    }
    /* (a batch's first record always fits) */
    int appended = writer_append((RecordWriter *)writer, timestamp, k.data, k.length, v.data,
                                 v.length, h.data, h.length);
    release_optional(&k);
    release_optional(&v);
    release_optional(&h);
    if (appended < 0)
        goto error;

    /* The partition's queue (a new one holding the batch already: queued below by
       listing it), and its open-batch lists (grown first if the topic grew). */
    if ((tp = PyTuple_Pack(2, topic, partition)) == NULL)
        goto error;
    queue = PyDict_GetItemWithError(self->batches, tp);
    Py_XINCREF(queue);
    if (queue == NULL) {
        if (PyErr_Occurred() || (queue = PyObject_CallNoArgs(deque_type)) == NULL)
            goto error;
        fresh = 1;
        /* Neither holds anything that leads back to it (a queue holds batches; the key a
           str and an int): the collector need not walk them, and at many partitions a
           partition's queue is made again for each batch (it goes when drained empty). */
        PyObject_GC_UnTrack(queue);
        PyObject_GC_UnTrack(tp);
        PyObject *queued = PyObject_CallMethodOneArg(queue, s_append, batch);
        if (queued == NULL)
            goto error;
        Py_DECREF(queued);
    }
    Py_ssize_t need = partitions > p + 1 ? partitions : p + 1;
    open = PyDict_GetItemWithError(self->appendable, topic);
    Py_XINCREF(open);
    if (open == NULL && PyErr_Occurred())
        goto error;
    if (open == NULL || !PyTuple_CheckExact(open) || PyTuple_GET_SIZE(open) != 2 ||
        !PyList_CheckExact(PyTuple_GET_ITEM(open, 0)) ||
        !PyList_CheckExact(PyTuple_GET_ITEM(open, 1)) ||
        PyList_GET_SIZE(PyTuple_GET_ITEM(open, 0)) != need ||
        PyList_GET_SIZE(PyTuple_GET_ITEM(open, 1)) != need) {
        Py_XDECREF(open);
        PyObject *count = PyLong_FromSsize_t(need);
        PyObject *call[3] = {(PyObject *)self, topic, count};
        open = count == NULL ? NULL
            : PyObject_VectorcallMethod(s_open_batches, call,
                                        3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_XDECREF(count);
        if (open == NULL)
            goto error;
        if (!PyTuple_CheckExact(open) || PyTuple_GET_SIZE(open) != 2 ||
            !PyList_CheckExact(PyTuple_GET_ITEM(open, 0)) ||
            !PyList_CheckExact(PyTuple_GET_ITEM(open, 1)) ||
            PyList_GET_SIZE(PyTuple_GET_ITEM(open, 0)) <= p ||
            PyList_GET_SIZE(PyTuple_GET_ITEM(open, 1)) <= p) {
            PyErr_SetString(PyExc_TypeError, "open_batches gives two lists, one per partition");
            goto error;
        }
    }

    /* A transaction's new partition (a round adds it, blocked or not: woken plainly). */
    PyObject *txn = self->txn;
    if (txn != NULL && txn != Py_None) {
        Py_INCREF(txn);
        PyObject *transactional = PyObject_GetAttr(txn, s_is_transactional);
        adding = transactional == NULL ? -1 : PyObject_IsTrue(transactional);
        Py_XDECREF(transactional);
        if (adding > 0) {
            PyObject *call[3] = {txn, topic, partition};
            PyObject *added = PyObject_VectorcallMethod(
                s_add_partition, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            adding = added == NULL ? -1 : PyObject_IsTrue(added);
            Py_XDECREF(added);
        }
        Py_DECREF(txn);
        if (adding < 0)
            goto error;
    }
    int unwoken = adding ? 0 : accumulator_lingers_unwoken(self, fresh, writer, now);
    if (unwoken < 0)
        goto error;
    wake = Py_XNewRef(adding ? self->wake_sender : self->wake_sender_for);
    if (wake == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the accumulator has no wake_sender");
        goto error;
    }

    /* Queued: incomplete, then in its partition's queue (each undone if the next fails). */
    if (PySet_Check(self->incomplete)) {
        if (PySet_Add(self->incomplete, batch) < 0)
            goto error;
    }
    else {
        PyObject *added = PyObject_CallMethodOneArg(self->incomplete, s_add, batch);
        if (added == NULL)
            goto error;
        Py_DECREF(added);
    }
    PyObject *queued = fresh ? (PyDict_SetItem(self->batches, tp, queue) < 0 ? NULL : Py_None)
        : PyObject_CallMethodOneArg(queue, s_append, batch);
    if (queued == NULL) {
        accumulator_unlist(self, batch);
        goto error;
    }
    if (!fresh)
        Py_DECREF(queued);

    /* From here nothing fails: the call has taken the record. */
    if (fresh) {
        if (now + self->linger < self->quiet_until)
            self->quiet_until = now + self->linger;
    }
    else
        self->quiet_until = 0.0;  /* the batch before it is sendable now */
    if (now + self->delivery_timeout < self->expiry_floor)
        self->expiry_floor = now + self->delivery_timeout;
    PyList_SetItem(PyTuple_GET_ITEM(open, 0), p, Py_NewRef(batch));  /* (p < their sizes) */
    PyList_SetItem(PyTuple_GET_ITEM(open, 1), p, Py_NewRef(writer));

    /* Wake the sender: a new linger deadline, or the batch before is full. */
    PyObject *call[2] = {batch, Py_True};
    PyObject *woken = unwoken ? Py_NewRef(Py_None)
        : adding ? PyObject_CallNoArgs(wake) : PyObject_Vectorcall(wake, call, 2, NULL);
    Py_DECREF(wake);
    if (woken == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
        /* The record is in its queued batch: the call has taken it, and must not fail (the
           Appender would append it again). See _wake_failed. */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        if (traceback != NULL)
            PyException_SetTraceback(value, traceback);
        woken = PyObject_CallMethodOneArg((PyObject *)self, s_wake_failed, value);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
    }
    Py_XDECREF(woken);
    Py_DECREF(queue);
    Py_DECREF(open);
    Py_DECREF(tp);
    Py_DECREF(held);
    Py_DECREF(deadline);
    Py_DECREF(created);
    Py_DECREF(number);
    Py_DECREF(future);
    Py_DECREF(writer);
    Py_DECREF(pool);
    if (woken == NULL) {
        /* (a BaseException, KeyboardInterrupt say: raised, the batch kept with its memory,
           and named on it for the caller whose record it holds; the Appender takes nothing
           again on one) */
        PyObject *type, *raised, *traceback;
        PyErr_Fetch(&type, &raised, &traceback);
        PyErr_NormalizeException(&type, &raised, &traceback);
        if (PyObject_GenericSetAttr(raised, s_kept_batch, batch) < 0)
            PyErr_Clear();  /* (no memory for it: the record goes uncounted) */
        PyErr_Restore(type, raised, traceback);
        Py_DECREF(batch);
        return NULL;
    }
    return batch;
error:
    /* Nothing queued: the memory reserved for the batch is the pool's again. */
    pool->available += reserved;
    Py_DECREF(pool);
    Py_XDECREF(wake);
    Py_XDECREF(queue);
    Py_XDECREF(open);
    Py_XDECREF(tp);
    Py_XDECREF(held);
    Py_XDECREF(deadline);
    Py_XDECREF(created);
    Py_XDECREF(number);
    Py_XDECREF(future);
    Py_XDECREF(writer);
    Py_XDECREF(batch);
    return NULL;
}

/* _open(topic, partition, timestamp, key, value, headers, reserved, partitions, now) */
static PyObject *
accumulator_open_method(AccumulatorFields *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 9, "_open(topic, partition, timestamp, key, value, headers, "
                    "reserved, partitions, now)"))
        return NULL;
    long long timestamp = as_long_long(args[2]);
    if (timestamp == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t reserved = PyLong_AsSsize_t(args[6]);
    if (reserved == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t partitions = PyLong_AsSsize_t(args[7]);
    if (partitions == -1 && PyErr_Occurred())
        return NULL;
    double now = PyFloat_AsDouble(args[8]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    return accumulator_open(self, args[0], args[1], timestamp, args[3], args[4], args[5],
                            reserved, partitions, now);
}

/* open_new(topic, partition, key, value, timestamp, partitions): see _py.AccumulatorFields. */
static PyObject *
accumulator_open_new(AccumulatorFields *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 6, "open_new(topic, partition, key, value, timestamp, partitions)"))
        return NULL;
    PyObject *topic = args[0], *key = args[2], *value = args[3];
    if (self->closing)
        Py_RETURN_NONE;
    if (self->line == NULL || self->pool == NULL ||
        !PyObject_TypeCheck(self->pool, &MemoryPoolType) || self->loop == NULL ||
        self->touched == NULL || !PyDict_Check(self->touched)) {
        PyErr_SetString(PyExc_TypeError, "the accumulator's fields are not set (or not of "
                        "their types)");
        return NULL;
    }
    Py_ssize_t waiting = PyObject_Length(self->line);
    if (waiting < 0)
        return NULL;
    if (waiting)
        Py_RETURN_NONE;
    if ((key != Py_None && !PyBytes_CheckExact(key)) ||
        (value != Py_None && !PyBytes_CheckExact(value)))
        Py_RETURN_NONE;  /* (the Python path checks and takes it) */
    long long timestamp = as_long_long(args[4]);
    if (timestamp == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t partitions = PyLong_AsSsize_t(args[5]);
    if (partitions == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t size = RECORD_MOST + (key != Py_None ? PyBytes_GET_SIZE(key) : 0)
        + (value != Py_None ? PyBytes_GET_SIZE(value) : 0);
    if (size > self->max_request_size || size > self->buffer_memory)
        Py_RETURN_NONE;
    Py_ssize_t memory = size > self->first_reserve ? size : self->first_reserve;
    MemoryPool *pool = (MemoryPool *)self->pool;
    if (memory > pool->available)
        Py_RETURN_NONE;
    PyObject *clock = PyObject_CallMethodNoArgs(self->loop, s_time);
    if (clock == NULL)
        return NULL;
    double now = PyFloat_AsDouble(clock);
    if ((now == -1.0 && PyErr_Occurred()) || PyDict_SetItem(self->touched, topic, clock) < 0) {
        Py_DECREF(clock);
        return NULL;
    }
    Py_DECREF(clock);
    pool->available -= memory;  /* (given back by the opening if it queues nothing) */
    return accumulator_open(self, topic, args[1], timestamp, key, value, Py_None, memory,
                            partitions, now);
}

#define SEQUENCE_WRAP (1LL << 31)  /* sequencing.py's _SEQUENCE_WRAP */

/* 1 if the int `number` is >= 0, else 0 (-1 with an error if it is no int). */
static int
not_negative(PyObject *number)
{
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(number, &overflow);
    if (value == -1 && !overflow && PyErr_Occurred())
        return -1;
    return overflow > 0 || (!overflow && value >= 0);
}

/* The idempotent producer's sequencer as a drain reads it, once a drain
   (TransactionManager.drain_view): so that the common batch, its producer id known and
   nothing of its partition in flight, is let go and numbered with no Python call (at 10,000
   partitions ~490 batches a request, each two calls: may_send and Sequencer.assign), and
   none goes without a producer id (the first drain, before InitProducerId's answer, asked
   may_send of every partition's batch). */
typedef struct {
    PyObject *held;  /* the view, which holds what follows */
    PyObject *in_txn;  /* the partitions in the transaction; None: not transactional */
    PyObject *producer_id, *epoch;
    PyObject *in_flight, *next_sequence, *unacked;  /* by partition (the sequencer's dicts) */
    int known;  /* a producer id */
} SequenceView;

static int
sequence_view_get(PyObject *txn, SequenceView *view)
{
    PyObject *held = view->held = PyObject_CallMethodNoArgs(txn, s_drain_view);
    if (held == NULL)
        return -1;
    if (!PyTuple_CheckExact(held) || PyTuple_GET_SIZE(held) != 6 ||
        !(PyTuple_GET_ITEM(held, 0) == Py_None || PyAnySet_Check(PyTuple_GET_ITEM(held, 0))) ||
        !PyLong_Check(PyTuple_GET_ITEM(held, 1)) || !PyLong_Check(PyTuple_GET_ITEM(held, 2)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(held, 3)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(held, 4)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(held, 5))) {
        PyErr_SetString(PyExc_TypeError, "drain_view() gives (partitions or None, producer "
                        "id, epoch, in flight, next sequence, unacknowledged), those dicts");
        return -1;
    }
    view->in_txn = PyTuple_GET_ITEM(held, 0);
    view->producer_id = PyTuple_GET_ITEM(held, 1);
    view->epoch = PyTuple_GET_ITEM(held, 2);
    view->in_flight = PyTuple_GET_ITEM(held, 3);
    view->next_sequence = PyTuple_GET_ITEM(held, 4);
    view->unacked = PyTuple_GET_ITEM(held, 5);
    view->known = not_negative(view->producer_id);
    return view->known < 0 ? -1 : 0;
}

#define ASK_MAY_SEND 2

/* The transaction manager's may_send for the batch of partition `tp` where the answer is
   plain: 0 without a producer id, or for a partition not in the transaction (yet: its batches
   wait for AddPartitionsToTxn's answer; at 10,000 partitions the first drain of each
   transaction asked may_send of every one); 1 with a producer id, the partition in the
   transaction (if any) and nothing of it in flight. ASK_MAY_SEND otherwise; -1 on an error. */
static int
may_send_at_once(SequenceView *view, PyObject *tp)
{
    if (!view->known)
        return 0;
    if (view->in_txn != Py_None) {
        int in = PySet_Contains(view->in_txn, tp);
        if (in <= 0)
            return in;
    }
    PyObject *in_flight = PyDict_GetItemWithError(view->in_flight, tp);
    if (in_flight == NULL)
        return PyErr_Occurred() ? -1 : 1;
    Py_ssize_t count = PyObject_Length(in_flight);
    return count < 0 ? -1 : count == 0 ? 1 : ASK_MAY_SEND;
}

/* Sequencer.assign on the view: number the batch of partition `tp` under the current
   producer id and epoch, unless it is already (a retry keeps its numbers). */
static int
number_batch(SequenceView *view, PyObject *tp, BatchFields *batch)
{
    if (batch->producer_id == NULL || batch->producer_epoch == NULL ||
        batch->base_sequence == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the batch's sequence fields are not set");
        return -1;
    }
    int current = PyObject_RichCompareBool(batch->producer_id, view->producer_id, Py_EQ);
    if (current > 0)
        current = PyObject_RichCompareBool(batch->producer_epoch, view->epoch, Py_EQ);
    if (current > 0)
        current = not_negative(batch->base_sequence);
    if (current != 0)
        return current < 0 ? -1 : 0;
    PyObject *next = PyDict_GetItemWithError(view->next_sequence, tp);
    if (next == NULL && PyErr_Occurred())
        return -1;
    long long sequence = next == NULL ? 0 : as_long_long(next);
    if (sequence == -1 && PyErr_Occurred())
        return -1;
    PyObject *writer = batch->writer;
    long long count;
    if (PyObject_TypeCheck(writer, &RecordWriterType))
        count = ((RecordWriter *)writer)->count;
    else {
        PyObject *counted = PyObject_GetAttrString(writer, "count");
        count = counted == NULL ? -1 : as_long_long(counted);
        Py_XDECREF(counted);
        if (count == -1 && PyErr_Occurred())
            return -1;
    }
    /* Everything that can fail first, the batch changed last. */
    PyObject *base = PyLong_FromLongLong(sequence);
    PyObject *after = PyLong_FromLongLong((sequence + count) % SEQUENCE_WRAP);
    PyObject *unacked = NULL;
    int failed = base == NULL || after == NULL;
    if (!failed) {
        unacked = PyDict_GetItemWithError(view->unacked, tp);
        if (unacked != NULL)
            Py_INCREF(unacked);
        else if (!PyErr_Occurred() && (unacked = PyDict_New()) != NULL &&
                 PyDict_SetItem(view->unacked, tp, unacked) < 0)
            Py_CLEAR(unacked);
        failed = unacked == NULL || PyDict_SetItem(view->next_sequence, tp, after) < 0 ||
            PyDict_SetItem(unacked, (PyObject *)batch, Py_None) < 0;
    }
    Py_XDECREF(unacked);
    Py_XDECREF(after);
    if (failed) {
        Py_XDECREF(base);
        return -1;
    }
    Py_SETREF(batch->producer_id, Py_NewRef(view->producer_id));
    Py_SETREF(batch->producer_epoch, Py_NewRef(view->epoch));
    Py_SETREF(batch->base_sequence, base);
    return 0;
}

/* The partition's first batch taken for a request (see _py.AccumulatorFields._take), numbered
   on `view` if not NULL (an idempotent producer). */
static PyObject *
take_batch(AccumulatorFields *self, PyObject *tp, PyObject *queue, SequenceView *view)
{
    if (self->batches == NULL || !PyDict_CheckExact(self->batches) ||
        self->appendable == NULL || !PyDict_CheckExact(self->appendable) ||
        self->drained_bytes == NULL || !PyDict_CheckExact(self->drained_bytes) ||
        self->codec == NULL || self->compression_level == NULL) {
        PyErr_SetString(PyExc_TypeError, "the accumulator's fields are not set (or not of "
                        "their types)");
        return NULL;
    }
    PyObject *batch = PyObject_CallMethodNoArgs(queue, s_popleft);
    if (batch == NULL)
        return NULL;
    if (!is_batch(batch)) {
        PyErr_SetString(PyExc_TypeError, "a queue holds batches");
        goto error;
    }
    BatchFields *fields = (BatchFields *)batch;
    if (fields->attempts == NULL || fields->writer == NULL || fields->topic == NULL ||
        fields->partition == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the batch's fields are not set");
        goto error;
    }
    if (PyDict_DelItem(self->batches, tp) < 0)
        goto error;
    Py_ssize_t left = PyObject_Length(queue);
    if (left < 0 || (left > 0 && PyDict_SetItem(self->batches, tp, queue) < 0))
        goto error;  /* (to the back of the line) */
    int first = PyLong_CheckExact(fields->attempts) && PyLong_AsLong(fields->attempts) == 0;
    if (first) {  /* first send: no more appends; compress once */
        PyObject *writer = fields->writer;
        /* No longer its partition's open batch (_unlist). */
        PyObject *open = PyDict_GetItemWithError(self->appendable, fields->topic);
        if (open == NULL && PyErr_Occurred())
            goto error;
        Py_ssize_t p = PyLong_AsSsize_t(fields->partition);
        if (p == -1 && PyErr_Occurred())
            goto error;
        if (open != NULL && PyTuple_CheckExact(open) && PyTuple_GET_SIZE(open) == 2 &&
            PyList_CheckExact(PyTuple_GET_ITEM(open, 0)) &&
            PyList_CheckExact(PyTuple_GET_ITEM(open, 1)) &&
            0 <= p && p < PyList_GET_SIZE(PyTuple_GET_ITEM(open, 0)) &&
            p < PyList_GET_SIZE(PyTuple_GET_ITEM(open, 1)) &&
            PyList_GET_ITEM(PyTuple_GET_ITEM(open, 0), p) == batch) {
            Py_INCREF(open);
            int unlisted = PyList_SetItem(PyTuple_GET_ITEM(open, 0), p, Py_NewRef(Py_None)) < 0 ||
                PyList_SetItem(PyTuple_GET_ITEM(open, 1), p, Py_NewRef(Py_None)) < 0;
            Py_DECREF(open);
            if (unlisted)
                goto error;
        }
        /* The partition's bytes sent (for the partitioner). */
        PyObject *size = PyObject_TypeCheck(writer, &RecordWriterType)
            ? PyLong_FromSsize_t(((RecordWriter *)writer)->size)
            : PyObject_GetAttrString(writer, "size");
        if (size == NULL)
            goto error;
        PyObject *before = PyDict_GetItemWithError(self->drained_bytes, tp);
        PyObject *sum = before != NULL ? PyNumber_Add(before, size)
            : PyErr_Occurred() ? NULL : Py_NewRef(size);
        Py_DECREF(size);
        if (sum == NULL)
            goto error;
        int stored = PyDict_SetItem(self->drained_bytes, tp, sum);
        Py_DECREF(sum);
        if (stored < 0)
            goto error;
        /* Sealed: uncompressed in place (the records as they are), else BatchWriter.close. */
        long codec = PyLong_Check(self->codec) ? PyLong_AsLong(self->codec) : -1;
        if (codec == -1 && PyErr_Occurred())
            goto error;
        if (codec == 0 && PyObject_TypeCheck(writer, &RecordWriterType)) {
            PyObject *records = writer_seal((RecordWriter *)writer, NULL);
            if (records == NULL)
                goto error;
            ((RecordWriter *)writer)->codec = 0;
            Py_XSETREF(((RecordWriter *)writer)->payload, records);
        }
        else {
            Py_INCREF(writer);
            PyObject *call[3] = {writer, self->codec, self->compression_level};
            PyObject *closed = PyObject_VectorcallMethod(
                s_close, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            Py_DECREF(writer);
            if (closed == NULL)
                goto error;
            Py_DECREF(closed);
        }
    }
    else if (PyErr_Occurred())
        goto error;
    if (view != NULL && number_batch(view, tp, fields) < 0)
        goto error;
    return batch;
error:
    Py_DECREF(batch);
    return NULL;
}

/* _take(tp, queue): see _py.AccumulatorFields._take. */
static PyObject *
accumulator_take(AccumulatorFields *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 2, "_take(tp, queue)"))
        return NULL;
    if (self->txn == NULL || self->txn == Py_None)
        return take_batch(self, args[0], args[1], NULL);
    SequenceView view = {NULL};
    PyObject *batch = sequence_view_get(self->txn, &view) < 0 ? NULL
        : take_batch(self, args[0], args[1], &view);
    Py_XDECREF(view.held);
    return batch;
}

/* _drain(topics, nodes, max_request_size, now): see _py.AccumulatorFields._drain. One call
   a round where drain() was a Python pass over the partitions it takes from (at 10,000
   partitions ~490 a request). */
typedef struct {
    long id;
    Py_ssize_t size;
    int full;
    PyObject *entries;  /* tp, queue, tp, queue, ... of the batches chosen */
} DrainNode;

static PyObject *s_may_send;  /* (interned at import) */

/* accumulator.py's _CLOCK_SLACK: a retry backoff a hair from its end is over. */
#define CLOCK_SLACK 1e-6

static PyObject *
accumulator_drain(AccumulatorFields *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 4, "_drain(topics, nodes, max_request_size, now)"))
        return NULL;
    PyObject *topics = args[0];
    if (self->batches == NULL || !PyDict_CheckExact(self->batches) || self->txn == NULL ||
        !PyDict_Check(topics)) {
        PyErr_SetString(PyExc_TypeError, "the accumulator's fields are not set, or topics is "
                        "not a dict");
        return NULL;
    }
    Py_ssize_t most = PyLong_AsSsize_t(args[2]);
    double now = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *ids = PySequence_List(args[1]);
    if (ids == NULL)
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(ids), full = 0;
    DrainNode *nodes = PyMem_Calloc(count ? count : 1, sizeof(DrainNode));
    PyObject *batches = Py_NewRef(self->batches), *leaders = NULL, *result = NULL;
    PyObject *last_topic = NULL;  /* (compared by identity, held by its key) */
    SequenceView view = {NULL}, *sequenced = self->txn == Py_None ? NULL : &view;
    if (nodes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (sequenced != NULL && sequence_view_get(self->txn, sequenced) < 0)
        goto done;
    for (Py_ssize_t k = 0; k < count; k++) {
        nodes[k].id = PyLong_AsLong(PyList_GET_ITEM(ids, k));
        if ((nodes[k].id == -1 && PyErr_Occurred()) || (nodes[k].entries = PyList_New(0)) == NULL)
            goto done;
    }
    Py_ssize_t at = 0;
    PyObject *tp, *queue;
    while (count && PyDict_Next(batches, &at, &tp, &queue)) {
        Py_INCREF(tp);
        Py_INCREF(queue);
        PyObject *batch = NULL;
        int failed = 1;
        if (!PyTuple_CheckExact(tp) || PyTuple_GET_SIZE(tp) != 2) {
            PyErr_SetString(PyExc_TypeError, "a queue's key is (topic, partition)");
            goto next;
        }
        PyObject *topic = PyTuple_GET_ITEM(tp, 0);
        if (topic != last_topic) {  /* (cluster.leader_for, inline: this is per partition) */
            last_topic = topic;
            Py_CLEAR(leaders);
            PyObject *info = PyDict_GetItemWithError(topics, topic);
            if (info == NULL && PyErr_Occurred())
                goto next;
            if (info != NULL && (leaders = PyObject_GetAttr(info, s_leaders)) == NULL)
                goto next;
        }
        long leader = -1;
        Py_ssize_t partition = PyLong_AsSsize_t(PyTuple_GET_ITEM(tp, 1));
        if (partition == -1 && PyErr_Occurred())
            goto next;
        if (leaders != NULL) {
            Py_ssize_t known = PyObject_Length(leaders);
            if (known < 0)
                goto next;
            if (0 <= partition && partition < known) {
                PyObject *id = PySequence_GetItem(leaders, partition);
                leader = id == NULL ? -1 : PyLong_AsLong(id);
                Py_XDECREF(id);
                if (PyErr_Occurred())
                    goto next;
            }
        }
        DrainNode *node = NULL;
        for (Py_ssize_t k = 0; k < count && node == NULL; k++)
            if (nodes[k].id == leader)
                node = &nodes[k];
        failed = 0;
        if (node == NULL || node->full)
            goto next;
        failed = 1;
        if ((batch = PySequence_GetItem(queue, 0)) == NULL)
            goto next;
        if (!is_batch(batch) ||
            ((BatchFields *)batch)->retry_at == NULL ||
            ((BatchFields *)batch)->writer == NULL ||
            !PyObject_TypeCheck(((BatchFields *)batch)->writer, &RecordWriterType)) {
            PyErr_SetString(PyExc_TypeError, "a queue holds batches (with their writers)");
            goto next;
        }
        double retry_at = PyFloat_AsDouble(((BatchFields *)batch)->retry_at);
        if (retry_at == -1.0 && PyErr_Occurred())
            goto next;
        failed = 0;
        if (retry_at - now > CLOCK_SLACK)
            goto next;
        if (sequenced != NULL) {
            int yes = may_send_at_once(sequenced, tp);
            if (yes == ASK_MAY_SEND) {
                PyObject *may = PyObject_CallMethodOneArg(self->txn, s_may_send, batch);
                yes = may == NULL ? -1 : PyObject_IsTrue(may);
                Py_XDECREF(may);
            }
            if (yes <= 0) {
                failed = yes < 0;
                goto next;
            }
        }
        Py_ssize_t size = ((RecordWriter *)((BatchFields *)batch)->writer)->size;
        if (PyList_GET_SIZE(node->entries) && node->size + size > most) {
            node->full = 1;
            if (++full == count)
                failed = -1;  /* every request is full: the rest would only be skipped */
            goto next;
        }
        node->size += size;
        failed = PyList_Append(node->entries, tp) < 0 || PyList_Append(node->entries, queue) < 0;
    next:
        Py_XDECREF(batch);
        Py_DECREF(tp);
        Py_DECREF(queue);
        if (failed > 0)
            goto done;
        if (failed < 0)
            break;
    }
    /* The batches taken, after the pass (_take changes the dict it walked). */
    PyObject *drained = PyDict_New();
    if (drained == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *entries = nodes[k].entries;
        if (!PyList_GET_SIZE(entries))
            continue;
        PyObject *taken = PyList_New(0);
        int failed = taken == NULL || PyDict_SetItem(drained, PyList_GET_ITEM(ids, k), taken) < 0;
        for (Py_ssize_t i = 0; !failed && i + 1 < PyList_GET_SIZE(entries); i += 2) {
            PyObject *pair[2] = {PyList_GET_ITEM(entries, i), PyList_GET_ITEM(entries, i + 1)};
            PyObject *batch = take_batch(self, pair[0], pair[1], sequenced);
            failed = batch == NULL || PyList_Append(taken, batch) < 0;
            Py_XDECREF(batch);
        }
        Py_XDECREF(taken);
        if (failed) {
            Py_DECREF(drained);
            goto done;
        }
    }
    result = drained;
done:
    if (nodes != NULL)
        for (Py_ssize_t k = 0; k < count; k++)
            Py_XDECREF(nodes[k].entries);
    PyMem_Free(nodes);
    Py_XDECREF(view.held);
    Py_XDECREF(leaders);
    Py_DECREF(batches);
    Py_DECREF(ids);
    return result;
}

/* _take_sendable(tp, queue): see _py.AccumulatorFields._take_sendable. Decided as _drain
   decides, on the sequencer's view: may_send is asked only where the answer is not plain
   (a Python call of two frames, ~1% of a send on an idle producer). */
static PyObject *
accumulator_take_sendable(AccumulatorFields *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!takes_args(nargs, 2, "_take_sendable(tp, queue)"))
        return NULL;
    if (self->txn == NULL || self->txn == Py_None)
        return take_batch(self, args[0], args[1], NULL);
    SequenceView view = {NULL};
    int yes = sequence_view_get(self->txn, &view) < 0 ? -1 : may_send_at_once(&view, args[0]);
    if (yes == ASK_MAY_SEND) {
        PyObject *first = PySequence_GetItem(args[1], 0);
        PyObject *may = first == NULL ? NULL
            : PyObject_CallMethodOneArg(self->txn, s_may_send, first);
        yes = may == NULL ? -1 : PyObject_IsTrue(may);
        Py_XDECREF(may);
        Py_XDECREF(first);
    }
    PyObject *batch = yes < 0 ? NULL : yes == 0 ? Py_NewRef(Py_None)
        : take_batch(self, args[0], args[1], &view);
    Py_XDECREF(view.held);
    return batch;
}

static PyMethodDef accumulator_methods[] = {
    {"_drain", (PyCFunction)(void (*)(void))accumulator_drain, METH_FASTCALL,
     "_drain(topics, nodes, max_request_size, now) -> {node: [batch, ...]}\n\n"
     "Take at most one batch per partition for each broker in `nodes`, up to\n"
     "max_request_size, partitions least recently drained first (see RecordAccumulator.drain)."},
    {"_take", (PyCFunction)(void (*)(void))accumulator_take, METH_FASTCALL,
     "_take(tp, queue) -> batch\n\n"
     "Take the partition's first batch for a request: off its queue (the queue to the back\n"
     "of the line), and, on its first send, closed for appends and sealed (compressed), its\n"
     "bytes counted as the partition's; numbered if idempotent."},
    {"_take_sendable", (PyCFunction)(void (*)(void))accumulator_take_sendable, METH_FASTCALL,
     "_take_sendable(tp, queue) -> batch | None\n\n"
     "_take(tp, queue) if the partition's first batch may be sent now, as _drain decides;\n"
     "else None, taking nothing."},
    {"open_new", (PyCFunction)(void (*)(void))accumulator_open_new, METH_FASTCALL,
     "open_new(topic, partition, key, value, timestamp, partitions) -> batch | None\n\n"
     "A new batch holding a record (key and value bytes or None, no headers) placed where\n"
     "its partition has no open batch, if nobody waits for memory and its memory is free;\n"
     "else None, having done nothing. The topic counts as produced to (`touched`)."},
    {"_open", (PyCFunction)(void (*)(void))accumulator_open_method, METH_FASTCALL,
     "_open(topic, partition, timestamp, key, value, headers, reserved, partitions, now)\n\n"
     "Open a batch at loop time `now`, with `reserved` bytes of memory already reserved for\n"
     "it, for a record that found no room in an open one; the record is its first."},
    {NULL}
};

#define ACCUMULATOR_OBJECT(name, field) \
    {name, T_OBJECT_EX, offsetof(AccumulatorFields, field), 0, NULL}

static PyMemberDef accumulator_members[] = {
    ACCUMULATOR_OBJECT("line", line),
    ACCUMULATOR_OBJECT("_pool", pool),
    ACCUMULATOR_OBJECT("_loop", loop),
    ACCUMULATOR_OBJECT("_batches", batches),
    ACCUMULATOR_OBJECT("appendable", appendable),
    ACCUMULATOR_OBJECT("incomplete", incomplete),
    ACCUMULATOR_OBJECT("_txn", txn),
    ACCUMULATOR_OBJECT("_lone_acked_at", lone_acked_at),
    ACCUMULATOR_OBJECT("wake_sender", wake_sender),
    ACCUMULATOR_OBJECT("wake_sender_for", wake_sender_for),
    ACCUMULATOR_OBJECT("touched", touched),
    ACCUMULATOR_OBJECT("_batch_type", batch_type),
    ACCUMULATOR_OBJECT("_writer_type", writer_type),
    ACCUMULATOR_OBJECT("_drained_bytes", drained_bytes),
    ACCUMULATOR_OBJECT("_codec", codec),
    ACCUMULATOR_OBJECT("_compression_level", compression_level),
    {"_batch_size", T_PYSSIZET, offsetof(AccumulatorFields, batch_size), 0, NULL},
    {"_first_reserve", T_PYSSIZET, offsetof(AccumulatorFields, first_reserve), 0, NULL},
    {"_max_request_size", T_PYSSIZET, offsetof(AccumulatorFields, max_request_size), 0, NULL},
    {"buffer_memory", T_PYSSIZET, offsetof(AccumulatorFields, buffer_memory), 0, NULL},
    {"_batches_created", T_PYSSIZET, offsetof(AccumulatorFields, batches_created), 0, NULL},
    {"_lone_in_a_row", T_PYSSIZET, offsetof(AccumulatorFields, lone_in_a_row), 0, NULL},
    {"_linger", T_DOUBLE, offsetof(AccumulatorFields, linger), 0, NULL},
    {"_delivery_timeout", T_DOUBLE, offsetof(AccumulatorFields, delivery_timeout), 0, NULL},
    {"_quiet_until", T_DOUBLE, offsetof(AccumulatorFields, quiet_until), 0, NULL},
    {"_expiry_floor", T_DOUBLE, offsetof(AccumulatorFields, expiry_floor), 0, NULL},
    {"_round_by", T_DOUBLE, offsetof(AccumulatorFields, round_by), 0, NULL},
    {"closing", T_BOOL, offsetof(AccumulatorFields, closing), 0, NULL},
    {"_said_linger_bound", T_BOOL, offsetof(AccumulatorFields, said_linger_bound), 0, NULL},
    {NULL}
};

static PyTypeObject AccumulatorFieldsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aioproducer._speedups._c.AccumulatorFields",
    .tp_doc = "The accumulator's state that opening a batch reads and writes, and the\n"
              "opening (open_new, _open) in one call.",
    .tp_basicsize = sizeof(AccumulatorFields),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)accumulator_dealloc,
    .tp_traverse = (traverseproc)accumulator_traverse,
    .tp_clear = (inquiry)accumulator_clear,
    .tp_members = accumulator_members,
    .tp_methods = accumulator_methods,
};

/* -- the module --------------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"murmur2", py_murmur2, METH_O,
     "murmur2(data) -> int: Kafka's Utils.murmur2 (seed 0x9747b28c), signed 32-bit."},
    {"partition_for_key", (PyCFunction)(void (*)(void))py_partition_for_key, METH_FASTCALL,
     "partition_for_key(key, num_partitions) -> int: toPositive(murmur2(key)) % n."},
    {"append_many", (PyCFunction)(void (*)(void))py_append_many, METH_FASTCALL,
     "append_many(records, start, batches, writers, partition, sticky, timestamp,\n"
     "            out_batches, out_deltas) -> (index, status, partition)\n\n"
     "Append records[start:] ((key, value) tuples of bytes or None, or Columns, read where\n"
     "they lie) to the writers of their partitions: `partition` if it is not -1, else\n"
     "murmur2 of the key, else `sticky`.\n"
     "`batches` and `writers` hold each partition's open batch and its writer, or None. For\n"
     "each record appended, add its batch to `out_batches` and its offset delta (a native\n"
     "int32) to `out_deltas`. Stop at the first record it cannot take: status 1 (NEEDS_BATCH)\n"
     "when its partition has no writer or the writer is full, 2 (NEEDS_PYTHON) when it is not\n"
     "a tuple of bytes or None (or is keyless and `sticky` is -1); 0 (DONE) when every record\n"
     "was appended. `index` is that record's (or len(records))."},
    {"same_context", (PyCFunction)(void (*)(void))py_same_context, METH_FASTCALL,
     "same_context(a, b) -> bool\n\n"
     "Whether two contextvars.Context hold the very same values (identity, not ==)."},
    {"run_callbacks", (PyCFunction)(void (*)(void))py_run_callbacks, METH_FASTCALL,
     "run_callbacks(report, records)\n\n"
     "Run the done callbacks of records' futures (a batch's, or a cancelled one), each in its\n"
     "own context, in the order they were added; report(record, fn, exc) what one raises\n"
     "(but SystemExit and KeyboardInterrupt, which propagate)."},
    {"append_record", (PyCFunction)(void (*)(void))py_append_record, METH_FASTCALL,
     "append_record(batches, writers, partition, timestamp, key, value, headers,\n"
     "              future_type) -> future | None\n\n"
     "Append a record (key, value and encoded headers as bytes or None) to its partition's\n"
     "open batch and make its future, future_type(batch, offset_delta, timestamp); None when\n"
     "the partition has no open batch or the record does not fit in it."},
    {"watch_batches", (PyCFunction)(void (*)(void))py_watch_batches, METH_FASTCALL,
     "watch_batches(batches, bulk) -> int\n\n"
     "Add `bulk` to the `_bulks` list of each distinct batch in `batches` that is not\n"
     "`done`, in order of first appearance; how many there were."},
    {"new_tuple", (PyCFunction)(void (*)(void))py_new_tuple, METH_FASTCALL,
     "new_tuple(cls, items) -> cls\n\n"
     "tuple.__new__(cls, items) for a tuple subclass, untracked by the garbage collector when\n"
     "no item can hold a reference (as the collector does for plain tuples)."},
    {"encode_produce", (PyCFunction)(void (*)(void))py_encode_produce, METH_FASTCALL,
     "encode_produce(version, correlation_id, client_id, body) -> bytes | list | None\n\n"
     "A Produce request frame (size prefix included) as protocol/messages.py's encode_request\n"
     "writes it, or None when the body is not the common case the sender builds. A batch's\n"
     "records may be its (header, payload); a payload of 16 KiB or more is not copied: the\n"
     "frame is then the list of its parts, [bytes, payload, bytes, ...], to write in order."},
    {"produce_parts", (PyCFunction)(void (*)(void))py_produce_parts, METH_FASTCALL,
     "produce_parts(batches, in_flight, now, sequenced, transactional)\n"
     "    -> (topic_data, size, earliest, waited, most)\n\n"
     "A Produce request's topic_data for `batches` (sealed), each batch's records its\n"
     "(header, payload), the header with the batch's producer id, epoch and base sequence\n"
     "if `sequenced` (else -1), and the transactional bit if `transactional`; each batch put\n"
     "in `in_flight`; with the bytes of\n"
     "their record batches, the earliest delivery deadline, and the sum and the longest of\n"
     "their times queued (loop time `now` less their creation)."},
    {"settle_produce", (PyCFunction)(void (*)(void))py_settle_produce, METH_FASTCALL,
     "settle_produce(batches, responses, in_flight, run_watchers, all_or_none)\n"
     "    -> (acked, rest)\n\n"
     "Match a Produce response's answers (its topics: name and partition_responses) to the\n"
     "request's batches. Each batch answered without an error leaves `in_flight` and is\n"
     "completed, and their records' callbacks run in one loop callback,\n"
     "run_watchers(batches); `rest` holds (batch, its answer or None) for the others, in\n"
     "order (with `all_or_none`, every batch unless all are answered without an error)."},
    {"take_acked", (PyCFunction)(void (*)(void))py_take_acked, METH_FASTCALL,
     "take_acked(batches, incomplete) -> (counted, freed, records, newest)\n\n"
     "Of `batches` (acknowledged), those in `incomplete`, taken out of it, with the memory\n"
     "they hold, their records, and the newest one's creation number (number[0])."},
    {"count_acked", (PyCFunction)(void (*)(void))py_count_acked, METH_FASTCALL,
     "count_acked(batches, now, bounds, buckets) -> ({topic: [records, batches, bytes]}, total)\n\n"
     "Per topic the records, batches and bytes of `batches` (acknowledged); each one's time\n"
     "since its creation counted into `buckets` (bisect_left over `bounds`), and their sum."},
    {"decode_produce", (PyCFunction)(void (*)(void))py_decode_produce, METH_FASTCALL,
     "decode_produce(version, frame) -> dict | None\n\n"
     "A Produce response's body as protocol/messages.py's decode_response reads it, or None\n"
     "when the frame is short, malformed or holds record errors or tagged fields."},
    {NULL}
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_c", "aioproducer's compiled speed-up (see _py.py).", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__c(void)
{
    if (PyType_Ready(&RecordWriterType) < 0 || PyType_Ready(&SealedRecordsType) < 0)
        return NULL;
    if (PyType_Ready(&RecordFieldsType) < 0 || PyType_Ready(&BatchFieldsType) < 0 ||
        PyType_Ready(&AwaitingType) < 0)
        return NULL;
    if (zero_float == NULL && (zero_float = PyFloat_FromDouble(0.0)) == NULL)
        return NULL;
    if (PyType_Ready(&ReadyType) < 0 || PyType_Ready(&AppenderType) < 0 ||
        PyType_Ready(&MemoryPoolType) < 0 || PyType_Ready(&ColumnsType) < 0 ||
        PyType_Ready(&AccumulatorFieldsType) < 0 || mark_coroutine_function(&AppenderType) < 0)
        return NULL;
    if (deque_type == NULL) {
        PyObject *collections = PyImport_ImportModule("collections");
        if (collections == NULL)
            return NULL;
        deque_type = PyObject_GetAttrString(collections, "deque");
        Py_DECREF(collections);
        if (deque_type == NULL)
            return NULL;
    }
    if (crc32c_function == NULL) {
        crc32c_table_init();
        PyObject *crc32c = PyImport_ImportModule("crc32c");
        if (crc32c == NULL)
            return NULL;
        crc32c_function = PyObject_GetAttrString(crc32c, "crc32c");
        Py_DECREF(crc32c);
        if (crc32c_function == NULL)
            return NULL;
    }
    struct { PyObject **name; const char *text; } names[] = {
        {&s_transactional_id, "transactional_id"}, {&s_acks, "acks"},
        {&s_timeout_ms, "timeout_ms"}, {&s_topic_data, "topic_data"}, {&s_name, "name"},
        {&s_partition_data, "partition_data"}, {&s_index, "index"}, {&s_records, "records"},
        {&s_responses, "responses"}, {&s_partition_responses, "partition_responses"},
        {&s_error_code, "error_code"}, {&s_base_offset, "base_offset"},
        {&s_log_append_time_ms, "log_append_time_ms"},
        {&s_log_start_offset, "log_start_offset"}, {&s_record_errors, "record_errors"},
        {&s_error_message, "error_message"}, {&s_throttle_time_ms, "throttle_time_ms"},
        {&s_topic_id, "topic_id"},
        {&s_untracked, "_untracked"}, {&s_future, "future"}, {&s_pieces, "pieces"},
        {&s_topic, "topic"}, {&s_partition, "partition"}, {&s_metadata_type, "_metadata_type"},
        {&s_metadata, "metadata"}, {&s_exception_for, "exception_for"}, {&s_watch, "watch"},
        {&s_bulks, "_bulks"}, {&s_may_send, "may_send"},
        {&s_done, "done"}, {&s_cancelled, "cancelled"}, {&s_get_loop, "get_loop"},
        {&s_result, "result"}, {&s_exception, "exception"}, {&s_context, "context"},
        {&s_state, "state"}, {&s_thread, "thread"}, {&s_loop_running, "loop_running"},
        {&s_topics, "topics"}, {&s_leaders, "leaders"}, {&s_line, "line"},
        {&s_appendable, "appendable"}, {&s_key, "key"}, {&s_timestamp_ms, "timestamp_ms"},
        {&s_headers, "headers"}, {&s_time, "time"}, {&s_create_future, "create_future"},
        {&s_append, "append"}, {&s_add, "add"}, {&s_is_transactional, "is_transactional"},
        {&s_add_partition, "add_partition"}, {&s_open_batches, "open_batches"},
        {&s_count_linger_bound, "_count_linger_bound"}, {&s_wake_failed, "_wake_failed"},
        {&s_kept_batch, "_aioproducer_kept_batch"}, {&s_set_result, "set_result"},
        {&s_call_soon, "call_soon"}, {&s_run_watchers, "_run_watchers"},
        {&s_piece_done, "_piece_done"}, {&s_pending, "_pending"}, {&s_resolve, "_resolve"},
        {&s_free, "free"}, {&s_popleft, "popleft"}, {&s_close, "close"},
        {&s_drain_view, "drain_view"}, {&s_discard, "discard"},
        {&s_has_producer_id, "has_producer_id"}, {&s_error, "error"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (*names[i].name == NULL &&
            (*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddType(module, &RecordFieldsType) < 0 ||
        PyModule_AddType(module, &BatchFieldsType) < 0 ||
        PyModule_AddType(module, &ReadyType) < 0 || PyModule_AddType(module, &AppenderType) < 0 ||
        PyModule_AddType(module, &MemoryPoolType) < 0 ||
        PyModule_AddType(module, &ColumnsType) < 0 ||
        PyModule_AddType(module, &AccumulatorFieldsType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&RecordWriterType);
    if (PyModule_AddObject(module, "RecordWriter", (PyObject *)&RecordWriterType) < 0 ||
        PyModule_AddIntConstant(module, "DONE", DONE) < 0 ||
        PyModule_AddIntConstant(module, "NEEDS_BATCH", NEEDS_BATCH) < 0 ||
        PyModule_AddIntConstant(module, "NEEDS_PYTHON", NEEDS_PYTHON) < 0) {
        Py_DECREF(&RecordWriterType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
