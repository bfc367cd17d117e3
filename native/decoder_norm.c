/* RMSNorm of the decoder families (see decoder.h): on the calling thread. */
#include "decoder.h"

#include <math.h>

/* ---- norms -------------------------------------------------------------------------- */

void ds4n_rms_norm(const float *x, const float *w, float *out, int64_t rows, int n, float eps) {
    for (int64_t t = 0; t < rows; t++) {
        const float *xr = x + t * n;
        float *o = out + t * n;
        double ss = 0.0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        const float scale = (float)(1.0 / sqrt(ss / n + eps));
        for (int i = 0; i < n; i++) o[i] = xr[i] * scale * w[i];
    }
}
