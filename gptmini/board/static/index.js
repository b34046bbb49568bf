// The ATTENTION tab (first cut: lists the runs and their logged steps; the views follow).
export async function render() {
  const response = await fetch('runs');
  const body = await response.json();
  const list = document.createElement('ul');
  for (const {run, tags} of body.runs) {
    const item = document.createElement('li');
    item.textContent = `${run}: ${tags.join(', ')}`;
    list.appendChild(item);
  }
  document.body.appendChild(list);
}
