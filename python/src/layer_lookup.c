/*
 * layer_lookup.c - engramstore._engram._LayerLookup: the layer API's
 * lookup_into(layer_id, row_ids, output) made in C, so that a decode step's
 * call runs no Python code between the caller and the lookup.
 *
 * engramstore.LayerStore makes one with Store._layer_lookup(layers,
 * fallback, live) and keeps it as its instance's lookup_into.  A call with
 * three positional arguments takes the layer id's table names from
 * `layers`, a dict of layer id -> tuple of names, and makes the lookup of
 * Store._lookup_layer(); the store's memo turns the names into table ids
 * with a few pointer compares.  A live dict (the open layers of a Mooncake
 * store) is read at every call; a dict that never changes (every layer of
 * a local store) whose keys are all ints is copied at the start into an
 * array indexed by the layer id, for the ids from 0 to EXT_LAYER_IDS - 1
 * (a probe of the dict is about 170 instructions, a sixth of what the
 * binding itself spends on a call).  Every other call (keywords, a layer id not in `layers`, any call
 * after _close()) goes to `fallback`, the Python method, with the same
 * arguments: it raises what it always raised, or opens a Mooncake layer
 * and looks up.
 */
#include "pystore.h"

#include <structmember.h>

/* Layer ids below this are looked up in an array (of a dict that never
 * changes). */
#define EXT_LAYER_IDS 4096

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    StoreObject *store;
    PyObject *layers;   /* dict: layer id -> tuple of the layer's table names */
    PyObject *fallback; /* callable */
    int closed;         /* _close() ran: every call goes to fallback */
    /* Of a dict that never changes: names[i] (borrowed from it, or NULL)
     * for the int layer ids i < nnames; none for a live one. */
    PyObject **names;
    Py_ssize_t nnames;
} LayerLookupObject;

static PyObject *LayerLookup_type;

static PyObject *LayerLookup_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                        PyObject *kwnames)
{
    LayerLookupObject *o = (LayerLookupObject *)self;
    PyObject *names, *ret;
    if (!o->fallback) /* cleared by the garbage collector */
        return ext_raise_cls(ext_StoreClosedError, ENGRAM_ESTATE, "the store is closed");
    if (o->closed || PyVectorcall_NARGS(nargsf) != 3 || kwnames)
        return PyObject_Vectorcall(o->fallback, args, nargsf, kwnames);
    if (o->names && PyLong_CheckExact(args[0])) {
        /* Every int key below nnames is in the array: an id there that has
         * no names is not in the dict either.  (-1 with OverflowError for
         * a huge id, cleared: not in the array, but maybe in the dict.) */
        Py_ssize_t i = PyLong_AsSsize_t(args[0]);
        if (i >= 0 && i < o->nnames)
            names = o->names[i];
        else {
            if (i == -1)
                PyErr_Clear();
            names = PyDict_GetItemWithError(o->layers, args[0]);
        }
    } else
        names = PyDict_GetItemWithError(o->layers, args[0]);
    if (!names || !PyTuple_CheckExact(names)) {
        /* The TypeError of an unhashable id is the one the method catches
         * (to raise its own); anything else raised by hashing or comparing
         * the id is raised as the method would let it through. */
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError))
                return NULL;
            PyErr_Clear();
        }
        return PyObject_Vectorcall(o->fallback, args, nargsf, kwnames);
    }
    /* Held: the dict may change while the GIL is released. */
    Py_INCREF(names);
    ret = ext_store_lookup_layer_call(o->store, names, args[1], args[2], args[0]);
    Py_DECREF(names);
    return ret;
}

static PyObject *LayerLookup_close(LayerLookupObject *o, PyObject *unused)
{
    (void)unused;
    o->closed = 1;
    Py_RETURN_NONE;
}

/* The layer store refers to its lookup_into, which refers back to it
 * through the fallback (a bound method): a cycle for the collector. */
static int LayerLookup_traverse(LayerLookupObject *o, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(o));
    Py_VISIT(o->store);
    Py_VISIT(o->layers);
    Py_VISIT(o->fallback);
    return 0;
}

static int LayerLookup_clear(LayerLookupObject *o)
{
    PyMem_Free(o->names); /* borrowed from layers */
    o->names = NULL;
    o->nnames = 0;
    Py_CLEAR(o->fallback);
    Py_CLEAR(o->layers);
    Py_CLEAR(o->store);
    return 0;
}

static void LayerLookup_dealloc(LayerLookupObject *o)
{
    PyTypeObject *tp = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    LayerLookup_clear(o);
    tp->tp_free((PyObject *)o);
    Py_DECREF(tp);
}

static PyMethodDef LayerLookup_methods[] = {
    {"_close", (PyCFunction)LayerLookup_close, METH_NOARGS,
     "_close($self, /)\n--\n\nSends every later call to the fallback (the layer store is "
     "closed)."},
    {NULL, NULL, 0, NULL},
};

/* What introspection asks of a method: inspect.signature() and help()
 * follow __wrapped__ to the Python method, whose name it has. */
static PyObject *LayerLookup_get_wrapped(LayerLookupObject *o, void *unused)
{
    (void)unused;
    if (!o->fallback)
        Py_RETURN_NONE;
    return Py_NewRef(o->fallback);
}

static PyObject *LayerLookup_get_name(LayerLookupObject *o, void *qual)
{
    if (!o->fallback)
        return PyUnicode_FromString("lookup_into");
    return PyObject_GetAttrString(o->fallback, qual ? "__qualname__" : "__name__");
}

static PyGetSetDef LayerLookup_getset[] = {
    {"__wrapped__", (getter)LayerLookup_get_wrapped, NULL, "The Python method.", NULL},
    {"__name__", (getter)LayerLookup_get_name, NULL, "The Python method's.", NULL},
    {"__qualname__", (getter)LayerLookup_get_name, NULL, "The Python method's.", (void *)1},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef LayerLookup_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(LayerLookupObject, vectorcall), READONLY,
     NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(LayerLookup_doc,
"lookup_into(layer_id, row_ids, output)\n\n"
"Gathers output[b, l, h] = table_h[row_ids[b, l, h]] for the layer's heads (see\n"
"engramstore.LayerStore.lookup_into, which this calls for anything but three\n"
"positional arguments naming a known layer).");

static PyType_Slot LayerLookup_slots[] = {
    {Py_tp_call, (void *)(uintptr_t)PyVectorcall_Call},
    {Py_tp_traverse, (void *)(uintptr_t)LayerLookup_traverse},
    {Py_tp_clear, (void *)(uintptr_t)LayerLookup_clear},
    {Py_tp_dealloc, (void *)(uintptr_t)LayerLookup_dealloc},
    {Py_tp_methods, LayerLookup_methods},
    {Py_tp_members, LayerLookup_members},
    {Py_tp_getset, LayerLookup_getset},
    {Py_tp_doc, (void *)(uintptr_t)LayerLookup_doc},
    {0, NULL},
};

static PyType_Spec LayerLookup_spec = {
    .name = "engramstore._engram._LayerLookup",
    .basicsize = sizeof(LayerLookupObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = LayerLookup_slots,
};

int ext_layer_lookup_module_init(PyObject *m)
{
    (void)m; /* made by Store._layer_lookup() only: not a module attribute */
    LayerLookup_type = PyType_FromSpec(&LayerLookup_spec);
    return LayerLookup_type ? 0 : -1;
}

const char ext_store_layer_lookup_doc[] = PyDoc_STR(
"_layer_lookup($self, layers, fallback, live, /)\n--\n\n"
"A callable f(layer_id, row_ids, output): _lookup_layer(layers[layer_id],\n"
"row_ids, output) for a layer id in the dict `layers` (its values tuples of\n"
"table names), and fallback(...) with the same arguments for any other call\n"
"(keywords, a layer id not in `layers`, or after f._close()).  live: the\n"
"dict may change and is read at every call; else it must never change.\n"
"engramstore.LayerStore makes its lookup_into with it.");

/* Fills o->names from the dict o->layers (which never changes), if all its
 * keys are ints (not a subclass, whose hash or equality may be its own):
 * 0, or -1 with an exception. */
static int index_layers(LayerLookupObject *o)
{
    PyObject *key, *value;
    Py_ssize_t pos = 0, n = 0;
    while (PyDict_Next(o->layers, &pos, &key, &value)) {
        Py_ssize_t i;
        if (!PyLong_CheckExact(key))
            return 0;
        i = PyLong_AsSsize_t(key);
        if (i == -1 && PyErr_Occurred())
            PyErr_Clear(); /* huge: left to the dict */
        else if (i >= 0 && i < EXT_LAYER_IDS && i >= n)
            n = i + 1;
    }
    if (n == 0)
        return 0;
    if (!(o->names = PyMem_Calloc((size_t)n, sizeof *o->names))) {
        PyErr_NoMemory();
        return -1;
    }
    o->nnames = n;
    pos = 0;
    while (PyDict_Next(o->layers, &pos, &key, &value))
        if (PyLong_CheckExact(key)) {
            Py_ssize_t i = PyLong_AsSsize_t(key);
            if (i == -1 && PyErr_Occurred())
                PyErr_Clear();
            else if (i >= 0 && i < n)
                /* Not a tuple: NULL, so the call goes to the fallback, as
                 * the dict probe's would. */
                o->names[i] = PyTuple_CheckExact(value) ? value : NULL;
        }
    return 0;
}

PyObject *ext_store_layer_lookup(StoreObject *s, PyObject *const *args, Py_ssize_t nargs)
{
    PyTypeObject *tp = (PyTypeObject *)LayerLookup_type;
    LayerLookupObject *o;
    int live;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "_layer_lookup() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if ((live = PyObject_IsTrue(args[2])) < 0)
        return NULL;
    if (!PyDict_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "_layer_lookup(layers, fallback): expected a dict and a "
                     "callable, got %.100s and %.100s", Py_TYPE(args[0])->tp_name,
                     Py_TYPE(args[1])->tp_name);
        return NULL;
    }
    if (!(o = (LayerLookupObject *)tp->tp_alloc(tp, 0)))
        return NULL;
    o->vectorcall = LayerLookup_vectorcall;
    o->store = (StoreObject *)Py_NewRef((PyObject *)s);
    o->layers = Py_NewRef(args[0]);
    o->fallback = Py_NewRef(args[1]);
    if (!live && index_layers(o) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    return (PyObject *)o;
}
