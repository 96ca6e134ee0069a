// Package browsertest tests dlock dash in a real headless Chromium, driven
// by chromedp. It is a module of its own so that chromedp and its
// dependencies stay out of dlock's go.mod; scripts/test runs it.
package browsertest
