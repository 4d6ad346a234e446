// The campaign builder's "all" and "none" buttons: <button data-check="FIELD" data-value="1 or empty">.
document.querySelectorAll("button[data-check]").forEach(button => button.addEventListener("click", () => {
  document.querySelectorAll(`input[name="${button.dataset.check}"]`).forEach(box => { box.checked = !!button.dataset.value; });
}));
