//go:build !amd64 || purego

package ring

func widenBF16(dst *float32, src *byte, n int)  { panic("unreachable") }
func narrowBF16(dst *byte, src *float32, n int) { panic("unreachable") }
func widenF16(dst *float32, src *byte, n int)   { panic("unreachable") }
func narrowF16(dst *byte, src *float32, n int)  { panic("unreachable") }
func addBF16(dst, a, b *byte, n int)            { panic("unreachable") }
func addF16(dst, a, b *byte, n int)             { panic("unreachable") }
