/* ropelab's small-call fast path: apply_rope's plans (ropelab/rope.py) kept and run in C++.
 *
 * ropelab/kernels/cpu_fast.py builds this file against the installed torch and documents the contract. A decode
 * step's RoPE on the CPU is a few microseconds of arithmetic; from Python, forming a plan key (the tensors'
 * shapes and strides, the positions' bytes), allocating the output and converting ctypes arguments cost more
 * than the rotation. Here that is done with torch's C++ tensors, under the GIL, in a fraction of a microsecond:
 *
 *   call(x, positions, layout, ..., out, inplace)   (apply_rope's 17 arguments, in its order)
 *       -> the rotated tensor, when a plan of this call's key is stored; else None (apply_rope goes on in Python)
 *   store(<the same 17 arguments>, packed, same_strides, x_bytes, out_bytes, cos, sin)
 *       -> stores the plan that apply_rope's Python path built for this call (a no-op for a call outside the
 *          fast path), the oldest one leaving past the limit
 *   init(kernel_address, spec_type, max_plans, max_bytes), clear(), size()
 *
 * The key holds what rope._plan_key holds: x's dtype, shape and strides; every setting (strings and numbers by
 * value; the angle dtype; a RopeSpec by identity, kept alive by the plan so its address is never reused, and
 * frozen, so identity implies the same value); the positions' dtype, shape and content; out's dtype, shape and
 * strides; inplace. A call outside the fast path (another backend, a scaling dict, varlen or multi-axis
 * positions, autograd, a tensor subclass, non-contiguous positions, x of max_bytes or more) returns None before
 * any lookup. The kernel is the C kernel of cpu_rope.c (its packed entry, whose address init receives), on the
 * plan's tables: the same kernel on the same tables as the Python path, so the same bits.
 */
#include <Python.h>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>

namespace {

constexpr int N_PACKED = 21;  // cpu_rope.N_PACKED: ropelab_rope's arguments as int64, x and out pointers first
constexpr Py_ssize_t N_CALL = 17;  // apply_rope's arguments
typedef int (*packed_kernel)(const int64_t *);

packed_kernel g_kernel = nullptr;
PyObject *g_spec_type = nullptr;
size_t g_max_plans = 64;
int64_t g_max_bytes = 1 << 20;

struct Plan {
    int64_t args[N_PACKED];
    bool same_strides;
    int64_t x_bytes, out_bytes;
    at::Tensor cos, sin;  // the tables the packed pointers point into, kept alive
    PyObject *spec;       // a strong reference (or nullptr): the key holds its address
};

std::unordered_map<std::string, Plan> g_plans;
std::deque<std::string> g_order;

void put_bytes(std::string &k, const void *p, size_t n) { k.append(static_cast<const char *>(p), n); }
template <class T> void put(std::string &k, T v) { put_bytes(k, &v, sizeof v); }

void put_meta(std::string &k, const at::Tensor &t) {
    put(k, static_cast<int32_t>(t.scalar_type()));
    put(k, static_cast<int64_t>(t.dim()));
    for (auto s : t.sizes()) put(k, static_cast<int64_t>(s));
    for (auto s : t.strides()) put(k, static_cast<int64_t>(s));
}

bool put_int(std::string &k, PyObject *o, bool none_ok) {
    if (o == Py_None && none_ok) {
        put(k, static_cast<uint8_t>(0));
        return true;
    }
    if (!PyLong_CheckExact(o)) return false;  // bool and int subclasses go the Python way, as in _plan_key
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
    }
    put(k, static_cast<uint8_t>(1));
    put(k, static_cast<int64_t>(v));
    return true;
}

bool put_str(std::string &k, PyObject *o) {
    if (!PyUnicode_CheckExact(o)) return false;
    Py_ssize_t n = 0;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s == nullptr) {
        PyErr_Clear();
        return false;
    }
    put(k, static_cast<int64_t>(n));
    put_bytes(k, s, static_cast<size_t>(n));
    return true;
}

bool plain_cpu(PyObject *o) {
    if (!THPVariable_CheckExact(o)) return false;
    const at::Tensor &t = THPVariable_Unpack(o);
    return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && !t.is_neg() && !t.is_conj();
}

bool position_dtype(at::ScalarType s) {
    return s == at::kLong || s == at::kInt || s == at::kShort || s == at::kDouble || s == at::kFloat;
}

// The plan key of apply_rope's arguments a[0..16], or false when the call is not one the fast path takes.
bool make_key(PyObject *const *a, std::string &k) {
    PyObject *x = a[0], *positions = a[1], *layout = a[2], *style = a[3], *base = a[4], *rotary_dim = a[5],
             *rope_scaling = a[6], *cu_seqlens = a[7], *offset = a[8], *max_pos = a[9], *seq_len = a[10],
             *angle_dtype = a[11], *spec = a[12], *backend = a[13], *sections = a[14], *out = a[15],
             *inplace = a[16];
    if (rope_scaling != Py_None || cu_seqlens != Py_None || sections != Py_None) return false;
    if (!PyUnicode_CheckExact(backend) || PyUnicode_CompareWithASCIIString(backend, "auto") != 0) return false;
    if (inplace != Py_True && inplace != Py_False) return false;
    if (!plain_cpu(x)) return false;
    const at::Tensor &xt = THPVariable_Unpack(x);
    if (xt.requires_grad() && c10::GradMode::is_enabled()) return false;
    if (static_cast<int64_t>(xt.numel()) * static_cast<int64_t>(xt.element_size()) >= g_max_bytes) return false;
    if (spec != Py_None && reinterpret_cast<PyObject *>(Py_TYPE(spec)) != g_spec_type) return false;
    if (!THPDtype_Check(angle_dtype)) return false;
    k.reserve(256);
    put_meta(k, xt);
    put(k, static_cast<uint8_t>(inplace == Py_True));
    if (!put_str(k, layout) || !put_str(k, style)) return false;
    if (PyFloat_CheckExact(base)) {
        put(k, static_cast<uint8_t>(2));
        put(k, PyFloat_AS_DOUBLE(base));
    } else if (!put_int(k, base, false)) {
        return false;
    }
    if (!put_int(k, rotary_dim, true) || !put_int(k, max_pos, true) || !put_int(k, seq_len, true) ||
        !put_int(k, offset, false))
        return false;
    put(k, static_cast<int32_t>(reinterpret_cast<THPDtype *>(angle_dtype)->scalar_type));
    put(k, reinterpret_cast<uintptr_t>(spec == Py_None ? nullptr : spec));
    if (positions == Py_None) {
        put(k, static_cast<uint8_t>(0));
    } else {
        if (!plain_cpu(positions)) return false;
        const at::Tensor &p = THPVariable_Unpack(positions);
        if (p.requires_grad() || !position_dtype(p.scalar_type()) || !p.is_contiguous()) return false;
        const int64_t nbytes = static_cast<int64_t>(p.numel()) * static_cast<int64_t>(p.element_size());
        if (nbytes > 65536) return false;
        put(k, static_cast<uint8_t>(1));
        put(k, static_cast<int32_t>(p.scalar_type()));
        put(k, static_cast<int64_t>(p.dim()));
        for (auto s : p.sizes()) put(k, static_cast<int64_t>(s));
        if (nbytes > 0) put_bytes(k, p.data_ptr(), static_cast<size_t>(nbytes));  // the content is the key
    }
    if (out == Py_None) {
        put(k, static_cast<uint8_t>(0));
    } else {
        if (!plain_cpu(out)) return false;
        const at::Tensor &o = THPVariable_Unpack(out);
        if (o.requires_grad()) return false;
        put(k, static_cast<uint8_t>(1));
        put_meta(k, o);
    }
    return true;
}

PyObject *fast_call(PyObject *, PyObject *const *a, Py_ssize_t n) {
    if (n != N_CALL) {
        PyErr_Format(PyExc_TypeError, "call takes apply_rope's %zd arguments, got %zd", N_CALL, n);
        return nullptr;
    }
    if (g_kernel == nullptr) Py_RETURN_NONE;
    try {
        std::string key;
        if (!make_key(a, key)) Py_RETURN_NONE;
        auto it = g_plans.find(key);
        if (it == g_plans.end()) Py_RETURN_NONE;
        const Plan &plan = it->second;
        const at::Tensor &x = THPVariable_Unpack(a[0]);
        const bool inplace = a[16] == Py_True;
        const int64_t x0 = reinterpret_cast<int64_t>(x.data_ptr());
        at::Tensor fresh;
        int64_t o0;
        if (inplace) {
            o0 = x0;
        } else if (a[15] == Py_None) {
            fresh = at::empty(x.sizes(), x.options());  // contiguous: the plan was built for x's own strides
            o0 = reinterpret_cast<int64_t>(fresh.data_ptr());
        } else {
            o0 = reinterpret_cast<int64_t>(THPVariable_Unpack(a[15]).data_ptr());
            if (o0 == x0) {
                if (!plan.same_strides) Py_RETURN_NONE;  // the Python way decides (and refuses)
            } else if (x0 < o0 + plan.out_bytes && o0 < x0 + plan.x_bytes) {
                Py_RETURN_NONE;  // overlapping out: the Python way refuses it by name
            }
        }
        int64_t args[N_PACKED];
        std::memcpy(args, plan.args, sizeof args);
        args[0] = x0;
        args[1] = o0;
        args[20] = at::get_num_threads();
        if (g_kernel(args) != 0) {
            PyErr_SetString(PyExc_ValueError, "the CPU kernel refused a stored plan's arguments (a ropelab bug: "
                                              "call ropelab.rope.clear_plans() and report it)");
            return nullptr;
        }
        if (inplace) return Py_NewRef(a[0]);
        if (a[15] != Py_None) return Py_NewRef(a[15]);
        return THPVariable_Wrap(std::move(fresh));
    } catch (const std::exception &) {
        // a tensor the fast path cannot read (no storage, a functorch wrapper...): the Python way decides
        PyErr_Clear();
        Py_RETURN_NONE;
    }
}

PyObject *fast_store(PyObject *, PyObject *const *a, Py_ssize_t n) {
    if (n != N_CALL + 6) {
        PyErr_Format(PyExc_TypeError, "store takes apply_rope's %zd arguments and 6 more, got %zd", N_CALL, n);
        return nullptr;
    }
    PyObject *packed = a[N_CALL], *same = a[N_CALL + 1], *xb = a[N_CALL + 2], *ob = a[N_CALL + 3],
             *cos = a[N_CALL + 4], *sin = a[N_CALL + 5];
    try {
        std::string key;
        if (!make_key(a, key)) Py_RETURN_FALSE;
        if (!THPVariable_Check(cos) || !THPVariable_Check(sin)) {
            PyErr_SetString(PyExc_TypeError, "store: cos and sin must be tensors");
            return nullptr;
        }
        Plan plan;
        Py_buffer view;
        if (PyObject_GetBuffer(packed, &view, PyBUF_SIMPLE) != 0) return nullptr;
        const bool fits = view.len == static_cast<Py_ssize_t>(sizeof plan.args);
        if (fits) std::memcpy(plan.args, view.buf, sizeof plan.args);
        PyBuffer_Release(&view);
        if (!fits) {
            PyErr_SetString(PyExc_ValueError, "store: packed must hold the kernel's 21 int64 arguments");
            return nullptr;
        }
        plan.same_strides = PyObject_IsTrue(same) == 1;
        plan.x_bytes = PyLong_AsLongLong(xb);
        plan.out_bytes = ob == Py_None ? 0 : PyLong_AsLongLong(ob);
        if (PyErr_Occurred()) return nullptr;
        plan.cos = THPVariable_Unpack(cos);
        plan.sin = THPVariable_Unpack(sin);
        plan.spec = a[12] == Py_None ? nullptr : Py_NewRef(a[12]);
        auto found = g_plans.find(key);
        if (found != g_plans.end()) {
            Py_XDECREF(found->second.spec);
            found->second = plan;
            Py_RETURN_TRUE;
        }
        while (!g_order.empty() && g_plans.size() >= g_max_plans) {
            auto old = g_plans.find(g_order.front());
            if (old != g_plans.end()) {
                Py_XDECREF(old->second.spec);
                g_plans.erase(old);
            }
            g_order.pop_front();
        }
        g_plans.emplace(key, plan);
        g_order.push_back(std::move(key));
        Py_RETURN_TRUE;
    } catch (const std::exception &e) {
        PyErr_Format(PyExc_RuntimeError, "store: %s", e.what());
        return nullptr;
    }
}

PyObject *fast_clear(PyObject *, PyObject *) {
    for (auto &kv : g_plans) Py_XDECREF(kv.second.spec);
    g_plans.clear();
    g_order.clear();
    Py_RETURN_NONE;
}

PyObject *fast_size(PyObject *, PyObject *) { return PyLong_FromSize_t(g_plans.size()); }

PyObject *fast_init(PyObject *, PyObject *const *a, Py_ssize_t n) {
    if (n != 4) {
        PyErr_SetString(PyExc_TypeError, "init(kernel_address, spec_type, max_plans, max_bytes)");
        return nullptr;
    }
    const unsigned long long address = PyLong_AsUnsignedLongLong(a[0]);
    const long long max_plans = PyLong_AsLongLong(a[2]), max_bytes = PyLong_AsLongLong(a[3]);
    if (PyErr_Occurred()) return nullptr;
    if (address == 0 || !PyType_Check(a[1]) || max_plans < 1 || max_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "init: a kernel address, a type and two positive limits");
        return nullptr;
    }
    fast_clear(nullptr, nullptr);
    g_kernel = reinterpret_cast<packed_kernel>(static_cast<uintptr_t>(address));
    Py_XSETREF(g_spec_type, Py_NewRef(a[1]));
    g_max_plans = static_cast<size_t>(max_plans);
    g_max_bytes = max_bytes;
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_call)), METH_FASTCALL,
     "apply_rope's 17 arguments -> the result from a stored plan, or None"},
    {"store", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_store)), METH_FASTCALL,
     "apply_rope's 17 arguments, packed, same_strides, x_bytes, out_bytes, cos, sin -> stored?"},
    {"init", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_init)), METH_FASTCALL,
     "init(kernel_address, spec_type, max_plans, max_bytes)"},
    {"clear", fast_clear, METH_NOARGS, "forget every plan"},
    {"size", fast_size, METH_NOARGS, "how many plans are stored"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "ropelab_cpu_fast", "ropelab's small-call fast path (cpu_fast.py)", -1,
                      methods};

}  // namespace

PyMODINIT_FUNC PyInit_ropelab_cpu_fast(void) { return PyModule_Create(&module); }
